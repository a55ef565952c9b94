// The CUDA copy engine at its edges, on a GPU: runs that start and end off
// the 16-byte vectors' alignment (1, 4, 8 and 12 bytes off), slice counts
// around one launch's limit (kSlicesPerLaunch), one run longer than 4 GiB
// (64-bit offsets all the way into the kernel), and 40,000 host<->device
// copies of pageable memory in one cudaMemcpyBatchAsync. Every byte is
// checked against what memcpy would have put there, including the bytes
// around each run, which must stay as they were. Skipped, saying why,
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "gpu/gpu_pool.h"
#include "kernels/copy_engine.h"
#include "kernels/copy_slice.h"
#include "kernels/cuda/gather_kernel.h"

namespace kvrelay::kernels {
namespace {

std::vector<std::byte> random_bytes(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v)
    b = static_cast<std::byte>(rng());
  return v;
}

// Device buffers holding `src` and a destination of `dst_fill`, and the host
// image of what the destination must hold after `runs`.
struct DevicePair {
  std::byte* src = nullptr;
  std::byte* dst = nullptr;
  std::vector<std::byte> expected;
  DevicePair(const std::vector<std::byte>& host_src, std::byte dst_fill)
      : expected(host_src.size(), dst_fill) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&src), host_src.size()), cudaSuccess);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dst), host_src.size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(src, host_src.data(), host_src.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaMemset(dst, static_cast<int>(dst_fill), host_src.size()), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // legacy stream vs the engine's
  }
  ~DevicePair() {
    (void)cudaFree(src);
    (void)cudaFree(dst);
  }
  std::vector<std::byte> download() const {
    std::vector<std::byte> got(expected.size());
    EXPECT_EQ(cudaMemcpy(got.data(), dst, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return got;
  }
};

Status copy_and_wait(CopyEngine& engine, const TensorCopy& copy) {
  Result<CopyTicket> t = engine.submit(std::span<const TensorCopy>(&copy, 1));
  if (!t) return t.error();
  return engine.wait(*t);
}

TEST(GpuGatherLimits, RunsOffTheVectorAlignmentLandExactlyAndTouchNothingAround) {
  KVRELAY_REQUIRE_GPU();
  auto engine = make_cuda_copy_engine({0, 16});
  ASSERT_TRUE(engine) << engine.error().message;
  const std::vector<std::byte> host = random_bytes(8 << 20, 11);
  DevicePair d(host, std::byte{0x5a});
  std::vector<CopyRun> runs;
  uint64_t at = 0;
  std::mt19937_64 rng(12);
  // Source and destination misaligned alike and differently, short and long.
  for (uint64_t src_off : {0U, 1U, 4U, 8U, 12U})
    for (uint64_t dst_off : {0U, 1U, 4U, 8U, 12U})
      for (uint64_t bytes : {1ULL, 15ULL, 17ULL, 4095ULL, 65537ULL, 200003ULL}) {
        runs.push_back(CopyRun{(rng() % 4096) * 16 + src_off, at + dst_off, bytes});
        at += (dst_off + bytes + 64 + 15) / 16 * 16;  // a gap after each run
      }
  ASSERT_LT(at, host.size());
  copy_runs_host(host.data(), d.expected.data(), runs);
  const TensorCopy copy{d.src, d.dst, runs, MemoryKind::kCuda, MemoryKind::kCuda};
  ASSERT_TRUE(copy_and_wait(**engine, copy));
  EXPECT_TRUE(d.download() == d.expected) << runs.size() << " misaligned runs";
}

TEST(GpuGatherLimits, SliceCountsAroundOneLaunchsLimitAllLand) {
  KVRELAY_REQUIRE_GPU();
  auto engine = make_cuda_copy_engine({0, 16});
  ASSERT_TRUE(engine) << engine.error().message;
  const uint64_t block = 4096;  // one slice per run
  const std::vector<std::byte> host = random_bytes(3000 * block, 21);
  const uint32_t limit = cuda::kSlicesPerLaunch;
  for (uint32_t slices : {1U, limit - 1, limit, limit + 1, 2 * limit + 1}) {
    DevicePair d(host, std::byte{0x33});
    std::vector<CopyRun> runs;
    for (uint32_t i = 0; i < slices; ++i)  // every other block, reversed order
      runs.push_back(CopyRun{uint64_t{i} * block, (2999 - uint64_t{i}) * block, block});
    copy_runs_host(host.data(), d.expected.data(), runs);
    const TensorCopy copy{d.src, d.dst, runs, MemoryKind::kCuda, MemoryKind::kCuda};
    ASSERT_TRUE(copy_and_wait(**engine, copy));
    EXPECT_TRUE(d.download() == d.expected) << slices << " slices";
  }
}

// Batches too large for one launch's parameters list their slices in device
// memory (kernels/cuda/slice_staging.h), kept until the batch completes.
// Six such batches in flight at once, of two sizes, each to its own region:
// a list reused before its batch ran would land one batch's blocks where
// another's belong. Then six more, which reuse the first six's lists.
TEST(GpuGatherLimits, LargeBatchesInFlightTogetherEachLandWhereTheirOwnListSays) {
  KVRELAY_REQUIRE_GPU();
  auto engine = make_cuda_copy_engine({0, 16});
  ASSERT_TRUE(engine) << engine.error().message;
  const uint64_t block = 4096;
  const uint64_t blocks_per_region = 8192;
  constexpr int kBatches = 6;
  const std::vector<std::byte> host = random_bytes(blocks_per_region * block, 31);
  const uint32_t limit = cuda::kSlicesPerLaunch;
  for (int round = 0; round < 2; ++round) {
    std::vector<std::unique_ptr<DevicePair>> pairs;
    std::vector<std::vector<CopyRun>> runs(kBatches);
    std::vector<CopyTicket> tickets;
    // All made first: a DevicePair synchronizes the whole device.
    for (int b = 0; b < kBatches; ++b)
      pairs.push_back(std::make_unique<DevicePair>(host, std::byte{0x77}));
    for (int b = 0; b < kBatches; ++b) {
      // Each batch its own permutation: block i lands at a place of its own.
      std::vector<uint64_t> to(blocks_per_region);
      std::iota(to.begin(), to.end(), 0);
      std::shuffle(to.begin(), to.end(), std::mt19937_64(100 * round + b));
      const uint32_t slices = b % 2 == 0 ? 3 * limit + 7 : 6000;
      for (uint32_t i = 0; i < slices; ++i)
        runs[b].push_back(CopyRun{uint64_t{i} * block, to[i] * block, block});
      copy_runs_host(host.data(), pairs[b]->expected.data(), runs[b]);
      const TensorCopy copy{pairs[b]->src, pairs[b]->dst, runs[b], MemoryKind::kCuda,
                            MemoryKind::kCuda};
      Result<CopyTicket> t = (*engine)->submit(std::span<const TensorCopy>(&copy, 1));
      ASSERT_TRUE(t) << t.error().message;
      tickets.push_back(*t);
    }
    ASSERT_TRUE((*engine)->wait(tickets.back()));
    for (int b = 0; b < kBatches; ++b)
      EXPECT_TRUE(pairs[b]->download() == pairs[b]->expected)
          << "round " << round << ", batch " << b << " (" << runs[b].size() << " slices)";
  }
}

// One run of 4 GiB + 1 MiB + 12,345 bytes, 7 bytes into the source and 3
// into the destination. Checked in windows of random bytes planted at its start,
// across the 4 GiB mark (where 32-bit offsets would wrap) and at its end,
// and at the bytes just outside it.
TEST(GpuGatherLimits, ARunLongerThanFourGiBLandsAcrossTheFourGiBMark) {
  KVRELAY_REQUIRE_GPU();
  auto engine = make_cuda_copy_engine({0, 132});
  ASSERT_TRUE(engine) << engine.error().message;
  const uint64_t run = (uint64_t{4} << 30) + (1 << 20) + 12345;
  const uint64_t size = run + (64 << 10);
  std::byte* src = nullptr;
  std::byte* dst = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&src), size), cudaSuccess) << "9 GiB of GPU memory";
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dst), size), cudaSuccess);
  ASSERT_EQ(cudaMemset(src, 0x11, size), cudaSuccess);
  ASSERT_EQ(cudaMemset(dst, 0x77, size), cudaSuccess);
  const uint64_t window = 64 << 10;
  const std::vector<uint64_t> at_src = {7, (uint64_t{4} << 30) - window / 2, 7 + run - window};
  // Apart: a later window planted over an earlier one would fail the
  // earlier one's check (the first device run of this test did just that).
  for (size_t i = 1; i < at_src.size(); ++i)
    ASSERT_GE(at_src[i], at_src[i - 1] + window)
        << "windows " << i - 1 << " and " << i << " overlap";
  std::vector<std::vector<std::byte>> planted;
  for (uint64_t s : at_src) {
    planted.push_back(random_bytes(window, s));
    ASSERT_EQ(cudaMemcpy(src + s, planted.back().data(), window, cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const CopyRun r{7, 3, run};
  const TensorCopy copy{src, dst, std::span<const CopyRun>(&r, 1), MemoryKind::kCuda,
                        MemoryKind::kCuda};
  ASSERT_TRUE(copy_and_wait(**engine, copy));
  for (size_t i = 0; i < at_src.size(); ++i) {
    std::vector<std::byte> got(window);
    ASSERT_EQ(cudaMemcpy(got.data(), dst + at_src[i] - 4, window, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_TRUE(got == planted[i]) << "the window planted at source byte " << at_src[i];
  }
  std::byte edges[6];
  ASSERT_EQ(cudaMemcpy(edges, dst, 3, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(edges + 3, dst + 3 + run, 3, cudaMemcpyDeviceToHost), cudaSuccess);
  for (std::byte e : edges)
    EXPECT_EQ(e, std::byte{0x77}) << "a byte outside the run changed";
  (void)cudaFree(src);
  (void)cudaFree(dst);
}

// Pageable host memory goes through the copy engines: 40,000 copies of 1 KiB
// in one call each way.
TEST(GpuGatherLimits, FortyThousandPageableCopiesInOneBatchLandBothWays) {
  KVRELAY_REQUIRE_GPU();
  auto engine = make_cuda_copy_engine({0, 16});
  ASSERT_TRUE(engine) << engine.error().message;
  const uint64_t n = 40'000, piece = 1024;
  const std::vector<std::byte> host = random_bytes(n * piece * 2, 31);
  DevicePair d(std::vector<std::byte>(host.size(), std::byte{0}), std::byte{0x44});
  std::vector<CopyRun> runs;
  for (uint64_t i = 0; i < n; ++i)  // to every other KiB, from a permutation
    runs.push_back(CopyRun{((i * 7919) % n) * piece, (2 * i + 1) * piece, piece});
  copy_runs_host(host.data(), d.expected.data(), runs);
  const TensorCopy up{host.data(), d.dst, runs, MemoryKind::kHost, MemoryKind::kCuda};
  ASSERT_TRUE(copy_and_wait(**engine, up));
  EXPECT_TRUE(d.download() == d.expected) << "host to device";
  std::vector<std::byte> back(host.size(), std::byte{0});
  std::vector<std::byte> back_expected(host.size(), std::byte{0});
  std::vector<CopyRun> down;
  for (const CopyRun& r : runs)
    down.push_back(CopyRun{r.dst_offset, r.src_offset, r.bytes});
  copy_runs_host(d.expected.data(), back_expected.data(), down);
  const TensorCopy dn{d.dst, back.data(), down, MemoryKind::kCuda, MemoryKind::kHost};
  ASSERT_TRUE(copy_and_wait(**engine, dn));
  EXPECT_TRUE(back == back_expected) << "device to host";
}

}  // namespace
}  // namespace kvrelay::kernels
