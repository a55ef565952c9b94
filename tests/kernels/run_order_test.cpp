// The order the host copies a layer's runs in (kernels/run_order.h): long,
// dense, scattered lists go in source order, every other list in its own;
// whichever order, every run lands exactly and nothing else is written.
#include "kernels/run_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "support/byte_pattern.h"

namespace kvrelay::kernels {
namespace {

using testing::byte_pattern;

// `count` runs of `run_bytes` between `count` slots of `slot_bytes` on each
// side, the slots taken in a shuffled order (scattered block ids). A slot
// larger than its run leaves gaps, so the runs fill run_bytes / slot_bytes
// of the span they lie in.
std::vector<CopyRun> scattered_runs(size_t count, uint64_t run_bytes, uint64_t slot_bytes,
                                    uint32_t seed) {
  std::vector<uint64_t> from(count), to(count);
  std::iota(from.begin(), from.end(), 0);
  std::iota(to.begin(), to.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(from.begin(), from.end(), rng);
  std::shuffle(to.begin(), to.end(), rng);
  std::vector<CopyRun> runs(count);
  for (size_t i = 0; i < count; ++i)
    runs[i] = {from[i] * slot_bytes, to[i] * slot_bytes, run_bytes};
  return runs;
}

RunsBetween between(const std::vector<CopyRun>& runs) {
  return RunsBetween{nullptr, nullptr, runs};
}

// Whether `order` visits every run of `runs` once, in ascending source offset.
void expect_source_order(std::span<const uint32_t> order, const std::vector<CopyRun>& runs) {
  ASSERT_EQ(order.size(), runs.size());
  std::vector<bool> seen(runs.size(), false);
  for (size_t k = 0; k < order.size(); ++k) {
    ASSERT_LT(order[k], runs.size());
    EXPECT_FALSE(seen[order[k]]) << "run " << order[k] << " visited twice";
    seen[order[k]] = true;
    if (k > 0) {
      EXPECT_LE(runs[order[k - 1]].src_offset, runs[order[k]].src_offset) << "step " << k;
    }
  }
}

TEST(RunOrder, ALongDenseScatteredListGoesInSourceOrder) {
  const std::vector<CopyRun> runs = scattered_runs(500, 4096, 4096, 1);
  const RunsBetween one = between(runs);
  expect_source_order(source_order({&one, 1}), runs);
  // A quarter of the span is still dense enough.
  const std::vector<CopyRun> quarter = scattered_runs(500, 1024, 4096, 2);
  const RunsBetween q = between(quarter);
  expect_source_order(source_order({&q, 1}), quarter);
}

TEST(RunOrder, ListsOfOneLengthFollowTheFirstListsSourceOrder) {
  const std::vector<CopyRun> first = scattered_runs(300, 2048, 2048, 3);
  std::vector<CopyRun> second = first;  // the next head slice of each block
  for (CopyRun& r : second)
    r.src_offset += 1024;
  const RunsBetween lists[] = {between(first), between(second)};
  expect_source_order(source_order(lists), first);
}

TEST(RunOrder, OtherListsKeepTheirOwnOrder) {
  // Too short to gain.
  const std::vector<CopyRun> short_list = scattered_runs(kSortRunsFrom - 1, 4096, 4096, 4);
  const RunsBetween s = between(short_list);
  EXPECT_TRUE(source_order({&s, 1}).empty());
  // Already in order (contiguous ids).
  std::vector<CopyRun> in_order(200);
  for (size_t i = 0; i < in_order.size(); ++i)
    in_order[i] = {i * 4096, (199 - i) * 4096, 4096};
  const RunsBetween o = between(in_order);
  EXPECT_TRUE(source_order({&o, 1}).empty());
  // Sparse: a fifth of the span (a request's blocks in a pool five times its size).
  const std::vector<CopyRun> sparse = scattered_runs(400, 4096, 5 * 4096, 5);
  const RunsBetween p = between(sparse);
  EXPECT_TRUE(source_order({&p, 1}).empty());
  // Lists of different lengths: their run i need not be the same block's.
  const std::vector<CopyRun> a = scattered_runs(100, 4096, 4096, 6);
  const std::vector<CopyRun> b(a.begin(), a.end() - 1);
  const RunsBetween lists[] = {between(a), between(b)};
  EXPECT_TRUE(source_order(lists).empty());
  EXPECT_TRUE(source_order({}).empty());
}

// Every byte where its run says, nothing else written, in the order the
// case expects (`sorted`: source order); with and without streaming stores.
void expect_copied_exactly(const std::vector<CopyRun>& runs, size_t pool_bytes, bool sorted) {
  const RunsBetween one = between(runs);
  ASSERT_EQ(source_order({&one, 1}).empty(), !sorted) << "the case must take the path it names";
  const std::vector<std::byte> src = byte_pattern(pool_bytes, 9);
  std::vector<std::byte> want(pool_bytes, std::byte{0xEE});
  for (const CopyRun& r : runs)
    std::memcpy(want.data() + r.dst_offset, src.data() + r.src_offset, r.bytes);
  for (const bool stream : {true, false}) {
    std::vector<std::byte> dst(pool_bytes, std::byte{0xEE});
    copy_runs_host(src.data(), dst.data(), runs, stream);
    EXPECT_EQ(std::memcmp(dst.data(), want.data(), pool_bytes), 0)
        << runs.size() << " runs, stream " << stream;
  }
}

TEST(RunOrder, EveryRunLandsExactlyWhicheverOrderItTook) {
  // Source order: dense, with runs above and below the streaming threshold.
  expect_copied_exactly(scattered_runs(400, 1500, 1536, 7), 400 * 1536, true);
  expect_copied_exactly(scattered_runs(400, 700, 1024, 8), 400 * 1024, true);
  // Their own order: sparse, and short.
  expect_copied_exactly(scattered_runs(200, 2048, 16384, 10), 200 * 16384, false);
  expect_copied_exactly(scattered_runs(10, 4096, 4096, 11), 10 * 4096, false);
}

TEST(RunOrder, InterleavedListsInSourceOrderLandExactly) {
  // Three head slices of 300 scattered blocks, each to its own destination.
  constexpr size_t kBlocks = 300, kParts = 3, kSlice = 1024 + 64;
  const std::vector<CopyRun> blocks = scattered_runs(kBlocks, kSlice * kParts, kSlice * kParts, 12);
  const std::vector<std::byte> src = byte_pattern(kBlocks * kParts * kSlice, 13);
  std::vector<std::vector<CopyRun>> runs(kParts);
  std::vector<std::vector<std::byte>> dst(
      kParts, std::vector<std::byte>(kBlocks * kSlice, std::byte{0xEE}));
  std::vector<RunsBetween> lists;
  for (size_t p = 0; p < kParts; ++p) {
    for (const CopyRun& b : blocks)
      runs[p].push_back({b.src_offset + p * kSlice, b.dst_offset / kParts, kSlice});
    lists.push_back({src.data(), dst[p].data(), runs[p]});
  }
  ASSERT_FALSE(source_order(lists).empty()) << "the case must take the sorted path";
  copy_runs_host_interleaved(lists);
  for (size_t p = 0; p < kParts; ++p) {
    std::vector<std::byte> want(kBlocks * kSlice, std::byte{0xEE});
    for (const CopyRun& r : runs[p])
      std::memcpy(want.data() + r.dst_offset, src.data() + r.src_offset, r.bytes);
    EXPECT_EQ(std::memcmp(dst[p].data(), want.data(), want.size()), 0) << "part " << p;
  }
}

TEST(RunOrder, EachThreadHasItsOwnScratch) {
  // Two threads sorting lists of different lengths at once: each order
  // stays its own list's (a shared scratch would hand one the other's).
  const std::vector<CopyRun> a = scattered_runs(3000, 512, 512, 14);
  const std::vector<CopyRun> b = scattered_runs(1000, 512, 512, 15);
  auto check = [](const std::vector<CopyRun>& runs) {
    const RunsBetween one = between(runs);
    for (int i = 0; i < 50; ++i) {
      const std::span<const uint32_t> order = source_order({&one, 1});
      ASSERT_EQ(order.size(), runs.size());
      for (size_t k = 1; k < order.size(); ++k)
        ASSERT_LT(runs[order[k - 1]].src_offset, runs[order[k]].src_offset);
    }
  };
  std::thread other(check, std::cref(b));
  check(a);
  other.join();
  // One thread, a long list then a shorter one: the scratch shrinks to it.
  const RunsBetween shorter = between(b);
  EXPECT_EQ(source_order({&shorter, 1}).size(), b.size());
}

}  // namespace
}  // namespace kvrelay::kernels
