// The host copy engine (kernels/copy_engine.h): a batch whose copies read
// one source tensor (a layer split by heads across decode ranks) goes a run
// of each in turn, and every byte of every copy lands where its runs say,
// whatever the lists' lengths, and nothing else is written; copies from
// other sources in the same batch land too.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/block_copy.h"
#include "kernels/copy_engine.h"
#include "support/byte_pattern.h"

namespace kvrelay::kernels {
namespace {

using testing::byte_pattern;

// A split of `blocks` source blocks of `parts` slices each: part p gets
// slice p of every block, its blocks packed one after the other.
std::vector<CopyRun> slice_runs(size_t blocks, size_t parts, size_t slice, size_t p) {
  std::vector<CopyRun> runs;
  for (size_t b = 0; b < blocks; ++b)
    runs.push_back({b * parts * slice + p * slice, b * slice, slice});
  return runs;
}

TEST(HostCopyEngine, CopiesThatReadOneSourceEachLandWholeAndNothingElseIsWritten) {
  constexpr size_t kBlocks = 37, kParts = 3, kSlice = 4096 + 64;
  const std::vector<std::byte> src = byte_pattern(kBlocks * kParts * kSlice, 5);
  const std::vector<std::byte> other_src = byte_pattern(3 << 16, 11);
  std::vector<std::vector<std::byte>> dst(
      kParts, std::vector<std::byte>(kBlocks * kSlice, std::byte{0xEE}));
  std::vector<std::byte> other_dst(3 << 16, std::byte{0xEE});
  std::vector<std::vector<CopyRun>> runs;
  for (size_t p = 0; p < kParts; ++p)
    runs.push_back(slice_runs(kBlocks, kParts, kSlice, p));
  runs[1].resize(kBlocks - 5);   // lists of different lengths
  runs[2].push_back({0, 0, 0});  // and an empty run
  const std::vector<CopyRun> other_runs = {{100, 1 << 16, 4000}, {1 << 17, 7, 50}};

  // Interleaved with a copy from another source, and one that is read soon
  // (kept apart: it goes through the cache).
  std::vector<std::byte> soon_dst(kBlocks * kSlice, std::byte{0xEE});
  const std::vector<TensorCopy> batch = {
      {src.data(), dst[0].data(), runs[0]},
      {other_src.data(), other_dst.data(), other_runs},
      {src.data(), dst[1].data(), runs[1]},
      {src.data(), soon_dst.data(), runs[0], MemoryKind::kHost, MemoryKind::kHost, true},
      {src.data(), dst[2].data(), runs[2]},
  };
  auto engine = make_host_copy_engine();
  auto ticket = engine->submit(batch);
  ASSERT_TRUE(ticket.ok()) << ticket.error().message;
  EXPECT_TRUE(engine->done(*ticket));

  auto expect_exactly = [](const std::vector<std::byte>& to, const std::vector<std::byte>& from,
                           const std::vector<CopyRun>& copied, const char* what) {
    std::vector<std::byte> want(to.size(), std::byte{0xEE});
    for (const CopyRun& r : copied)
      std::memcpy(want.data() + r.dst_offset, from.data() + r.src_offset, r.bytes);
    EXPECT_EQ(std::memcmp(to.data(), want.data(), to.size()), 0) << what;
  };
  expect_exactly(dst[0], src, runs[0], "part 0");
  expect_exactly(dst[1], src, runs[1], "part 1, a shorter list");
  expect_exactly(dst[2], src, runs[2], "part 2, with an empty run");
  expect_exactly(soon_dst, src, runs[0], "the copy read soon");
  expect_exactly(other_dst, other_src, other_runs, "the other source's copy");
  // Part 1's last five blocks were not in its list: untouched.
  EXPECT_EQ(dst[1][(kBlocks - 5) * kSlice], std::byte{0xEE});
}

TEST(HostCopyEngine, ABatchLargerThanItInterleavesStillLandsEveryCopy) {
  constexpr size_t kCopies = 70, kSlice = 2048;
  const std::vector<std::byte> src = byte_pattern(kCopies * kSlice, 3);
  std::vector<std::vector<std::byte>> dst(kCopies, std::vector<std::byte>(kSlice, std::byte{0}));
  std::vector<std::vector<CopyRun>> runs(kCopies);
  std::vector<TensorCopy> batch;
  for (size_t i = 0; i < kCopies; ++i) {
    runs[i] = {{i * kSlice, 0, kSlice}};
    batch.push_back({src.data(), dst[i].data(), runs[i]});
  }
  auto engine = make_host_copy_engine();
  ASSERT_TRUE(engine->submit(batch).ok());
  for (size_t i = 0; i < kCopies; ++i)
    ASSERT_EQ(std::memcmp(dst[i].data(), src.data() + i * kSlice, kSlice), 0) << "copy " << i;
}

}  // namespace
}  // namespace kvrelay::kernels
