// Two ranks' device signals in one process (a single-process multi-GPU
// engine, the C API, a test): the 16 ranks' signal words share one page, and
// CUDA registers a page once per process, so each writer's word comes from
// one counted registration (kernels/pin_registry.h). Before that, the second
// rank's open failed with cudaErrorHostMemoryAlreadyRegistered. Skipped,
// saying why, without a GPU.
#include <gtest/gtest.h>

#include <atomic>

#include "gpu/gpu_pool.h"
#include "kernels/stream_signals.h"

namespace kvrelay::kernels {
namespace {

// As in the instance status: every rank's word on one page.
struct alignas(4096) SignalPage {
  std::atomic<uint64_t> words[16];
};

TEST(GpuSignals, TwoRanksInOneProcessEachSignalTheirOwnWordFromOnePinnedPage) {
  KVRELAY_REQUIRE_GPU();
  static SignalPage page{};
  Result<std::unique_ptr<LayerSignalWriter>> rank0 = LayerSignalWriter::open(&page.words[0]);
  ASSERT_TRUE(rank0) << rank0.error().message;
  Result<std::unique_ptr<LayerSignalWriter>> rank1 = LayerSignalWriter::open(&page.words[1]);
  ASSERT_TRUE(rank1) << "the second rank's word is on the same page: " << rank1.error().message;
  cudaStream_t stream = nullptr;
  KVRELAY_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_TRUE((*rank0)->begin_step(stream, 100));
  ASSERT_TRUE((*rank0)->signal_layer(stream, 2));
  ASSERT_TRUE((*rank1)->begin_step(stream, 200));
  ASSERT_TRUE((*rank1)->signal_layer(stream, 0));
  KVRELAY_CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(page.words[0].load(), 103U);
  EXPECT_EQ(page.words[1].load(), 201U);
  // Rank 0's writer goes; the page stays pinned for rank 1's.
  rank0->reset();
  ASSERT_TRUE((*rank1)->signal_layer(stream, 1));
  KVRELAY_CUDA_OK(cudaStreamSynchronize(stream));
  EXPECT_EQ(page.words[1].load(), 202U);
  rank1->reset();
  KVRELAY_CUDA_OK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace kvrelay::kernels
