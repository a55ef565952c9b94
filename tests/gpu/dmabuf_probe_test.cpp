// Whether this GPU and driver export GPU memory as dma-bufs (what GPUDirect
// RDMA through ibv_reg_dmabuf_mr needs), probed without a NIC: cudaMalloc
// memory, and a VMM range of three chunks (PyTorch's expandable segments),
// where each export covers the one chunk that holds the address, so the
// rdma transport must register chunk by chunk. Every span must describe the
// memory it was asked for: offset and length inside its allocation. Where
// the driver refuses dma-bufs altogether the test skips, saying why (a
// failure under KVRELAY_REQUIRE_GPU, so tools/gpu-check reports it).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "gpu/gpu_pool.h"
#include "kernels/dmabuf.h"

namespace kvrelay::kernels {
namespace {

bool is_open_fd(const UniqueFd& fd) {
  struct stat st {};
  return fd.get() >= 0 && ::fstat(fd.get(), &st) == 0;
}

TEST(GpuDmabuf, CudaMallocMemoryExportsAsOneSpanFromTheAskedAddress) {
  KVRELAY_REQUIRE_GPU();
  const size_t bytes = 64 << 20;
  std::byte* p = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&p), bytes), cudaSuccess);
  const uint64_t into = 3 * 4096 + 100;
  Result<DmabufSpan> span = export_dmabuf(p + into);
  if (!span && span.error().code == Errc::kUnsupported) {
    (void)cudaFree(p);
    GTEST_SKIP() << "this driver exports no dma-buf: " << span.error().message;
  }
  ASSERT_TRUE(span) << span.error().message;
  EXPECT_TRUE(is_open_fd(span->fd));
  EXPECT_EQ(span->offset, into);
  EXPECT_EQ(span->bytes, bytes - into);
  (void)cudaFree(p);
}

TEST(GpuDmabuf, AVmmRangeOfThreeChunksExportsChunkByChunk) {
  KVRELAY_REQUIRE_GPU();
  // A pool of a little over two chunks of the device's granularity (2 MiB).
  PoolGeometry g{};
  g.num_layers = 1;
  g.num_blocks = 5000;  // 1 KiB blocks: K and V of 5 MB each
  g.block_size = 16;
  g.kv_heads = 1;
  g.head_dim = 32;
  g.dtype = static_cast<uint32_t>(CacheDtype::kBf16);
  testing::GpuPool pool(g, testing::GpuPool::Kind::kVmm, 0);
  ASSERT_TRUE(pool.ok());
  ASSERT_GE(pool.vmm_chunks(), 3u);
  const std::byte* base = pool.device_tensor(0);
  const uint64_t chunk = pool.vmm_granularity();
  for (size_t c = 0; c < 3; ++c) {
    const uint64_t into = c * chunk + 4096 * (c + 1);
    Result<DmabufSpan> span = export_dmabuf(base + into);
    if (!span && span.error().code == Errc::kUnsupported)
      GTEST_SKIP() << "this driver exports no dma-buf: " << span.error().message;
    ASSERT_TRUE(span) << "chunk " << c << ": " << span.error().message;
    EXPECT_TRUE(is_open_fd(span->fd));
    EXPECT_EQ(span->offset, into - c * chunk) << "chunk " << c;
    EXPECT_EQ(span->bytes, chunk - span->offset) << "chunk " << c << ": one chunk, not the range";
  }
}

}  // namespace
}  // namespace kvrelay::kernels
