// A forward pass captured once in a CUDA graph signals its layers from the
// device: each captured layer writes its KV into the engine's GPU pool and
// then signal_layer. Replayed for two steps (two requests), each preceded by
// push_device_step outside the graph, every byte of both requests reaches
// the decode engine's GPU pool. The engine then destroys its stream before
// the client goes, as engines do: the client's teardown must not touch that
// stream (the first GPU run crashed in cuStreamQuery there; kernels/
// stream_marks.h).
#include <gtest/gtest.h>

#include "gpu/gpu_pool.h"
#include "integration/request_driver.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kGraphLayers = 4;

TEST(GpuGraphSignals, AGraphCapturedForwardSignalsItsLayersFromTheDeviceForEveryReplay) {
  KVRELAY_REQUIRE_GPU();
  InstanceArgs a = RequestDriver::small_pair();
  a.tp = 1;
  TwoInstances env("gpugraph", a);
  Client& engine = env.engine();
  const PoolGeometry g = engine.info().device_pool;
  GpuPool src(g, GpuPool::Kind::kCudaMalloc, 0);
  GpuPool dst(env.decode().client().info().device_pool, GpuPool::Kind::kCudaMalloc, 0);
  ASSERT_TRUE(src.ok() && dst.ok());
  for (auto [client, pool] : {std::pair{&engine, &src}, std::pair{&env.decode().client(), &dst}}) {
    const std::vector<uint64_t> addresses = pool->addresses();
    ASSERT_TRUE(client->register_cuda_pool(0, PoolTier::kDevice, addresses, Deadline::after(5s)));
    Result<Completion> c = client->wait(Deadline::after(30s));
    ASSERT_TRUE(c && c->status == CompletionStatus::kFinished) << (c ? c->message : "");
  }

  // The "model": per layer, K and V of blocks [10, 15) come from a staging
  // buffer (its output) into the pool, then the layer is signalled.
  const std::vector<uint32_t> blocks = {10, 11, 12, 13, 14};
  const uint64_t block_bytes = g.block_bytes(PoolTensor::kKey);
  const uint64_t span = blocks.size() * block_bytes;
  std::byte* staging = nullptr;
  KVRELAY_CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&staging), span * kGraphLayers * 2));
  cudaStream_t stream = nullptr;
  KVRELAY_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ASSERT_TRUE(engine.own_device_signals(0));  // outside the capture: it allocates
  cudaGraph_t graph = nullptr;
  KVRELAY_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (uint32_t l = 0; l < kGraphLayers; ++l) {
    for (uint32_t t = 0; t < 2; ++t)
      ASSERT_EQ(
          cudaMemcpyAsync(src.device_tensor(l * 2 + t) + blocks[0] * block_bytes,
                          staging + (l * 2 + t) * span, span, cudaMemcpyDeviceToDevice, stream),
          cudaSuccess);
    ASSERT_TRUE(engine.signal_layer(0, l, stream)) << "layer " << l;
  }
  KVRELAY_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t forward = nullptr;
  KVRELAY_CUDA_OK(cudaGraphInstantiate(&forward, graph, 0));

  for (uint32_t step = 1; step <= 2; ++step) {
    const std::string id = "graph-step-" + std::to_string(step);
    sim::RequestBlocks r;
    r.tag = 900 + step;
    r.src = blocks;
    for (uint32_t b : blocks)
      r.dst.push_back(b + 40 * step);
    // What this step's forward computes: the request's pattern.
    sim::fill_request(src.host(), 0, r);
    for (uint32_t l = 0; l < kGraphLayers; ++l)
      for (uint32_t t = 0; t < 2; ++t)
        KVRELAY_CUDA_OK(cudaMemcpy(staging + (l * 2 + t) * span,
                                   src.host().block(l, static_cast<PoolTensor>(t), blocks[0]), span,
                                   cudaMemcpyHostToDevice));
    const uint32_t tokens = blocks.size() * RequestDriver::kBlockTokens;
    ASSERT_TRUE(env.submit_task(id, r, tokens, step));
    ASSERT_TRUE(env.submit_dest(id, r));
    const std::vector<BatchSlot> batch = {{step, 0, tokens, Client::request_tag(id)}};
    ASSERT_TRUE(engine.push_device_step(0, step, batch, kGraphLayers, stream, Deadline::after(5s)));
    KVRELAY_CUDA_OK(cudaGraphLaunch(forward, stream));
    const Completion c = env.wait_for(id, 60s);
    ASSERT_EQ(c.status, CompletionStatus::kFinished) << c.message;
    dst.download();
    EXPECT_EQ(sim::check_request(dst.host(), 0, r), 0U) << "step " << step;
  }
  (void)cudaGraphExecDestroy(forward);
  (void)cudaGraphDestroy(graph);
  (void)cudaStreamDestroy(stream);
  (void)cudaFree(staging);
  env.stop_and_check_clean();
}

}  // namespace
}  // namespace kvrelay::testing
