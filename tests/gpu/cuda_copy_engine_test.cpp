// The CUDA copy engine on a GPU: device-to-device gathers (the kernel),
// host<->device batches of pageable memory (cudaMemcpyBatchAsync) and of
// pinned, mapped memory (the kernel again) land byte for byte, as the
// host engine's memcpy would put them, tickets end in order, and an SM cap
// of one still copies everything. Skipped, saying why, without a GPU.
#include <gtest/gtest.h>

#include <array>
#include <random>
#include <vector>

#include "gpu/gpu_pool.h"
#include "kernels/copy_engine.h"
#include "kernels/host_pinning.h"

namespace kvrelay::kernels {
namespace {

struct Buffers {
  std::vector<std::byte> host_src, host_expected;
  std::byte* dev_src = nullptr;
  std::byte* dev_dst = nullptr;
  size_t bytes;
  explicit Buffers(size_t n) : host_src(n), host_expected(n), bytes(n) {
    std::mt19937_64 rng(n);
    for (auto& b : host_src)
      b = static_cast<std::byte>(rng());
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev_src), n), cudaSuccess);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev_dst), n), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(dev_src, host_src.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMemset(dev_dst, 0x5a, n), cudaSuccess);
    // The memset runs on the legacy stream, which the engine's non-blocking
    // streams do not wait for.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::fill(host_expected.begin(), host_expected.end(), std::byte{0x5a});
  }
  ~Buffers() {
    (void)cudaFree(dev_src);
    (void)cudaFree(dev_dst);
  }
};

// Random non-overlapping destination runs of 16 KiB blocks, some coalesced.
std::vector<CopyRun> random_runs(size_t bytes, uint64_t block, std::mt19937_64& rng) {
  const uint64_t blocks = bytes / block;
  std::vector<uint64_t> dst(blocks);
  for (uint64_t i = 0; i < blocks; ++i)
    dst[i] = i;
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<CopyRun> runs;
  for (uint64_t i = 0; i < blocks / 2;) {
    const uint64_t len = 1 + rng() % 4;  // up to 4 blocks per run, when they line up
    uint64_t n = 1;
    while (n < len && i + n < blocks / 2 && dst[i + n] == dst[i] + n)
      ++n;
    runs.push_back(CopyRun{(rng() % (blocks - n + 1)) * block, dst[i] * block, n * block});
    i += n;
  }
  return runs;
}

TEST(CudaCopyEngine, GatherBetweenDeviceBuffersMatchesMemcpyOnRandomRuns) {
  KVRELAY_REQUIRE_GPU();
  for (uint32_t max_sms : {1U, 16U}) {
    Result<std::unique_ptr<CopyEngine>> engine = make_cuda_copy_engine({0, max_sms});
    ASSERT_TRUE(engine) << engine.error().message;
    Buffers b(64 << 20);
    std::mt19937_64 rng(max_sms);
    const std::vector<CopyRun> runs = random_runs(b.bytes, 16 << 10, rng);
    copy_runs_host(b.host_src.data(), b.host_expected.data(), runs);
    const TensorCopy copy{b.dev_src, b.dev_dst, runs, MemoryKind::kCuda, MemoryKind::kCuda};
    Result<CopyTicket> t = (*engine)->submit(std::span<const TensorCopy>(&copy, 1));
    ASSERT_TRUE(t) << t.error().message;
    ASSERT_TRUE((*engine)->wait(*t));
    std::vector<std::byte> got(b.bytes);
    KVRELAY_CUDA_OK(cudaMemcpy(got.data(), b.dev_dst, b.bytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, b.host_expected) << max_sms << " SMs";
  }
}

TEST(CudaCopyEngine, HostToDeviceAndBackInOneBatchEachMatchMemcpy) {
  KVRELAY_REQUIRE_GPU();
  Result<std::unique_ptr<CopyEngine>> engine = make_cuda_copy_engine({0, 16});
  ASSERT_TRUE(engine) << engine.error().message;
  Buffers b(32 << 20);
  std::mt19937_64 rng(3);
  const std::vector<CopyRun> up = random_runs(b.bytes, 16 << 10, rng);
  // Host -> device: from the host source into the device destination.
  const TensorCopy h2d{b.host_src.data(), b.dev_dst, up, MemoryKind::kHost, MemoryKind::kCuda};
  Result<CopyTicket> t1 = (*engine)->submit(std::span<const TensorCopy>(&h2d, 1));
  ASSERT_TRUE(t1) << t1.error().message;
  copy_runs_host(b.host_src.data(), b.host_expected.data(), up);
  // Device -> host, queued behind it (stream order): the device destination back.
  std::vector<std::byte> back(b.bytes, std::byte{0});
  const CopyRun whole{0, 0, b.bytes};
  const TensorCopy d2h{b.dev_dst, back.data(), std::span<const CopyRun>(&whole, 1),
                       MemoryKind::kCuda, MemoryKind::kHost};
  Result<CopyTicket> t2 = (*engine)->submit(std::span<const TensorCopy>(&d2h, 1));
  ASSERT_TRUE(t2);
  EXPECT_LT(*t1, *t2);
  ASSERT_TRUE((*engine)->wait(*t2));
  EXPECT_TRUE((*engine)->done(*t1)) << "tickets end in order";
  EXPECT_EQ(back, b.host_expected);
  EXPECT_TRUE((*engine)->failure());
}

// Pinned, mapped host memory (a swapping worker's host tier) goes through the
// gather kernel by its device address rather than the copy engines: the
// same bytes as memcpy both ways, at offsets that are not 16-byte aligned.
TEST(CudaCopyEngine, PinnedHostMemoryTravelsThroughTheKernelBothWaysMatchingMemcpy) {
  KVRELAY_REQUIRE_GPU();
  Result<std::unique_ptr<CopyEngine>> engine = make_cuda_copy_engine({0, 16});
  ASSERT_TRUE(engine) << engine.error().message;
  Buffers b(32 << 20);
  std::vector<std::byte> back(b.bytes, std::byte{0});
  Result<PinnedHostRange> pinned_src = PinnedHostRange::pin(b.host_src.data(), b.bytes, true);
  ASSERT_TRUE(pinned_src) << pinned_src.error().message;
  Result<PinnedHostRange> pinned_back = PinnedHostRange::pin(back.data(), back.size(), true);
  ASSERT_TRUE(pinned_back) << pinned_back.error().message;
  std::mt19937_64 rng(5);
  std::vector<CopyRun> up = random_runs(b.bytes, 16 << 10, rng);
  for (size_t i = 0; i < up.size(); i += 3) {  // a third of them shifted off alignment
    const uint64_t shift = std::array<uint64_t, 4>{1, 4, 8, 12}[i % 4];
    if (up[i].bytes > 2 * shift) {
      up[i].src_offset += shift;
      up[i].dst_offset += shift;
      up[i].bytes -= 2 * shift;
    }
  }
  const TensorCopy h2d{b.host_src.data(), b.dev_dst, up, MemoryKind::kHost, MemoryKind::kCuda};
  Result<CopyTicket> t1 = (*engine)->submit(std::span<const TensorCopy>(&h2d, 1));
  ASSERT_TRUE(t1) << t1.error().message;
  copy_runs_host(b.host_src.data(), b.host_expected.data(), up);
  const CopyRun whole{0, 0, b.bytes};
  const TensorCopy d2h{b.dev_dst, back.data(), std::span<const CopyRun>(&whole, 1),
                       MemoryKind::kCuda, MemoryKind::kHost};
  Result<CopyTicket> t2 = (*engine)->submit(std::span<const TensorCopy>(&d2h, 1));
  ASSERT_TRUE(t2) << t2.error().message;
  ASSERT_TRUE((*engine)->wait(*t2)) << (*engine)->failure().error().message;
  EXPECT_TRUE(back == b.host_expected) << "the bytes that came back differ from memcpy's";
}

}  // namespace
}  // namespace kvrelay::kernels
