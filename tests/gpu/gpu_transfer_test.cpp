// A prefill-to-decode transfer between two instances whose pools are the
// engines' GPU memory, registered by tensor address: cudaMalloc memory
// (legacy IPC handles) and VMM memory in allocations of the device's
// granularity that tensors straddle (POSIX fds, chunk by chunk). Every byte
// of the request lands in the decode engine's GPU pool, nothing else moves:
// over ipc (CUDA IPC, the gather kernel) and over tcp (staged through
// pinned host slots on each side).
#include <gtest/gtest.h>

#include "gpu/gpu_pool.h"
#include "integration/request_driver.h"
#include "integration/tcp_hosts.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

void register_gpu_pools(Client& engine, const std::vector<std::unique_ptr<GpuPool>>& pools) {
  for (uint32_t rank = 0; rank < pools.size(); ++rank) {
    const std::vector<uint64_t> addresses = pools[rank]->addresses();
    ASSERT_TRUE(engine.register_cuda_pool(rank, PoolTier::kDevice, addresses, Deadline::after(5s)));
    Result<Completion> c = engine.wait(Deadline::after(30s));
    ASSERT_TRUE(c) << c.error().message;
    ASSERT_EQ(c->kind, CompletionKind::kRegisterPool);
    ASSERT_EQ(c->status, CompletionStatus::kFinished) << c->message;
  }
}

enum class Over { kIpc, kTcp };

struct GpuTransferCase {
  GpuPool::Kind kind;
  Over over;
};

class GpuTransfer : public ::testing::TestWithParam<GpuTransferCase> {};

// Over tcp the decode instance listens on a second host (a network namespace,
// or loopback), and each side stages its GPU pool through pinned slots.
TEST_P(GpuTransfer, ATransferBetweenGpuPoolsLandsByteForByteAndNowhereElse) {
  KVRELAY_REQUIRE_GPU();
  InstanceArgs a = RequestDriver::small_pair();
  a.blocks = 1000;  // 2 MB tensors: VMM allocations of 2 MiB do not line up with them
  const bool tcp = GetParam().over == Over::kTcp;
  std::unique_ptr<TcpHosts> hosts = tcp ? std::make_unique<TcpHosts>("gtcp", a.tp) : nullptr;
  TwoInstances env(tcp ? "gpuxfer-tcp" : "gpuxfer", a, hosts ? hosts->placement() : Placement{});
  if (hosts) env.set_route(hosts->route());
  RequestDriver driver(env, RequestDriver::kLayers, RequestDriver::kBlockTokens);
  std::vector<std::unique_ptr<GpuPool>> src, dst;
  for (uint32_t rank = 0; rank < env.tp(); ++rank) {
    src.push_back(std::make_unique<GpuPool>(env.prefill().client().info().device_pool,
                                            GetParam().kind, rank));
    dst.push_back(
        std::make_unique<GpuPool>(env.decode().client().info().device_pool, GetParam().kind, rank));
    ASSERT_TRUE(src.back()->ok() && dst.back()->ok()) << "GPU allocation failed";
  }
  sim::RequestBlocks r;
  r.tag = 77;
  r.src = {3, 4, 5, 6, 900, 17, 2};
  r.dst = {10, 11, 12, 13, 14, 600, 999};
  for (uint32_t rank = 0; rank < env.tp(); ++rank) {
    sim::fill_request(src[rank]->host(), rank, r);
    src[rank]->upload();
    const PoolView& d = dst[rank]->host();
    for (uint32_t l = 0; l < RequestDriver::kLayers; ++l)
      for (uint32_t t = 0; t < 2; ++t)
        for (uint32_t b : {9U, 10U, 15U, 598U, 599U, 600U, 601U, 999U})
          sim::poison_block(d, l, t, b);
    dst[rank]->upload();
  }
  register_gpu_pools(env.prefill().client(), src);
  register_gpu_pools(env.decode().client(), dst);

  driver.submit("gpu-to-gpu", r, 0);
  driver.layers_done(0, RequestDriver::kLayers);
  const Completion c = env.wait_for("gpu-to-gpu", 60s);
  ASSERT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  for (uint32_t rank = 0; rank < env.tp(); ++rank) {
    dst[rank]->download();
    EXPECT_EQ(sim::check_request(dst[rank]->host(), rank, r), 0U) << "rank " << rank;
    for (uint32_t b : {9U, 15U, 599U, 601U})
      EXPECT_TRUE(sim::block_is_poisoned(dst[rank]->host(), 1, 1, b)) << "block " << b;
  }
  env.stop_and_check_clean();
}

INSTANTIATE_TEST_SUITE_P(AllocatorsAndTransports, GpuTransfer,
                         ::testing::Values(GpuTransferCase{GpuPool::Kind::kCudaMalloc, Over::kIpc},
                                           GpuTransferCase{GpuPool::Kind::kVmm, Over::kIpc},
                                           GpuTransferCase{GpuPool::Kind::kCudaMalloc, Over::kTcp}),
                         [](const auto& c) {
                           return std::string(c.param.kind == GpuPool::Kind::kVmm ? "vmm"
                                                                                  : "cudaMalloc") +
                                  (c.param.over == Over::kTcp ? "_tcp" : "_ipc");
                         });

}  // namespace
}  // namespace kvrelay::testing
