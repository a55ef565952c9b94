// Swap with a GPU device pool: evict GPU blocks to the host tier (pinned for
// the copy engines), overwrite them, load them back, and wait for each
// layer both ways an engine can: on the host (wait_layer) and on its stream
// (stream_wait_layer, then a copy on that stream that must see the layer).
#include <gtest/gtest.h>

#include "gpu/gpu_pool.h"
#include "integration/two_instances.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kGpuSwapLayers = 4;

TEST(GpuSwap, ALoadIsWaitedOnLayerByLayerOnTheHostAndOnTheStream) {
  KVRELAY_REQUIRE_GPU();
  InstanceArgs a;
  a.instance = unique_instance("gpuswap");
  a.tp = 1;
  a.layers = kGpuSwapLayers;
  a.blocks = 256;
  a.host_blocks = 256;
  a.head_dim = 128;
  std::unique_ptr<Instance> inst = Instance::start(a);
  Client& engine = inst->client();
  GpuPool pool(engine.info().device_pool, GpuPool::Kind::kCudaMalloc, 0);
  ASSERT_TRUE(pool.ok());
  const std::vector<uint32_t> dev = {3, 4, 5, 200, 17};
  const std::vector<uint32_t> host = {100, 101, 102, 7, 250};
  sim::fill_request(pool.host(), 0, sim::RequestBlocks{5, dev, dev});
  pool.upload();
  const std::vector<uint64_t> addresses = pool.addresses();
  ASSERT_TRUE(engine.register_cuda_pool(0, PoolTier::kDevice, addresses, Deadline::after(5s)));
  Result<Completion> reg = engine.wait(Deadline::after(30s));
  ASSERT_TRUE(reg && reg->status == CompletionStatus::kFinished) << (reg ? reg->message : "");

  SwapSpec evict;
  evict.request_id = "evict";
  evict.device_block_ids = dev;
  evict.host_block_ids = host;
  ASSERT_TRUE(engine.submit(evict, Deadline::after(5s)));
  Result<Completion> out = engine.wait(Deadline::after(30s));
  ASSERT_TRUE(out && out->status == CompletionStatus::kFinished) << (out ? out->message : "");

  // The blocks on the GPU are overwritten; the load must bring them back.
  for (uint32_t l = 0; l < kGpuSwapLayers; ++l)
    for (uint32_t t = 0; t < 2; ++t)
      for (uint32_t b : dev)
        sim::poison_block(pool.host(), l, t, b);
  pool.upload();
  cudaStream_t stream = nullptr;
  KVRELAY_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The stream waits for layer 2 before it reads block 3's K of layer 2.
  std::vector<std::byte> seen(pool.host().geometry().block_bytes(PoolTensor::kKey));
  SwapSpec load = evict;
  load.request_id = "load";
  load.load = true;
  ASSERT_TRUE(engine.submit(load, Deadline::after(5s)));
  ASSERT_TRUE(engine.stream_wait_layer("load", 2, stream, Deadline::after(10s)));
  void* pinned = nullptr;
  KVRELAY_CUDA_OK(cudaMallocHost(&pinned, seen.size()));
  KVRELAY_CUDA_OK(cudaMemcpyAsync(pinned, pool.device_tensor(2 * 2) + 3 * seen.size(), seen.size(),
                                  cudaMemcpyDeviceToHost, stream));
  for (uint32_t l = 0; l < kGpuSwapLayers; ++l)
    ASSERT_TRUE(engine.wait_layer("load", l, Deadline::after(30s))) << "layer " << l;
  KVRELAY_CUDA_OK(cudaStreamSynchronize(stream));
  std::memcpy(seen.data(), pinned, seen.size());
  const std::byte* want = pool.host().block(2, PoolTensor::kKey, 3);   // the poison, on the host
  sim::fill_request(pool.host(), 0, sim::RequestBlocks{5, dev, dev});  // what it must be
  EXPECT_EQ(std::memcmp(seen.data(), want, seen.size()), 0)
      << "the stream read layer 2 only once it was loaded";
  Result<Completion> in = engine.wait(Deadline::after(30s));
  ASSERT_TRUE(in && in->status == CompletionStatus::kFinished) << (in ? in->message : "");
  pool.download();
  EXPECT_EQ(sim::check_request(pool.host(), 0, sim::RequestBlocks{5, dev, dev}), 0U);
  (void)cudaFreeHost(pinned);
  (void)cudaStreamDestroy(stream);
  EXPECT_EQ(inst->stop(), 0);
}

}  // namespace
}  // namespace kvrelay::testing
