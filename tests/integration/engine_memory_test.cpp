// Engines that bring their own memory by file descriptor, end to end through
// real processes: memfds stand in for GPU memory exported as POSIX fds (a
// CUDA VMM allocation travels the same way). Both engines register memfd
// pools through Client::register_pool; the fds reach each rank's worker over
// its fd socket; the prefill workers fetch the decode ranks' pools from
// theirs. Transfers land byte for byte in the decode engine's memfds and
// nowhere else, and when the decode engine registers again the prefill side
// drops its mapping and follows.
#include <gtest/gtest.h>

#include "client/views.h"
#include "integration/memfd_pool_spec.h"
#include "integration/request_driver.h"
#include "kernels/copy_engine.h"
#include "support/memfd_pool.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

// An engine's memfd pool for one rank, and a view of it for the patterns.
struct EnginePool {
  std::shared_ptr<MemfdPool> memory;
  std::unique_ptr<PoolView> view;
};

EnginePool make_pool(const PoolGeometry& g, uint32_t rank, const std::string& name) {
  EnginePool p;
  p.memory = std::make_shared<MemfdPool>(g, g.tensors_per_layer());  // a memfd per layer
  std::vector<std::byte*> tensors;
  for (uint32_t t = 0; t < g.total_layers() * g.tensors_per_layer(); ++t)
    tensors.push_back(p.memory->tensor(t));
  p.view = std::make_unique<PoolView>(pool_view_of(g, tensors, p.memory, name, rank));
  return p;
}

void register_all(Client& engine, const std::vector<EnginePool>& pools) {
  for (uint32_t rank = 0; rank < pools.size(); ++rank) {
    ASSERT_TRUE(
        engine.register_pool(memfd_pool_spec(*pools[rank].memory, rank), Deadline::after(5s)));
    Result<Completion> c = engine.wait(Deadline::after(20s));
    ASSERT_TRUE(c) << c.error().message;
    ASSERT_EQ(c->kind, CompletionKind::kRegisterPool);
    ASSERT_EQ(c->status, CompletionStatus::kFinished) << c->message;
  }
}

std::vector<EnginePool> pools_for(Instance& instance, const std::string& tag) {
  std::vector<EnginePool> pools;
  const InstanceInfo& info = instance.client().info();
  for (uint32_t rank = 0; rank < info.tp_size; ++rank) {
    pools.push_back(make_pool(info.device_pool, rank, tag));
    const PoolView& v = *pools.back().view;
    for (uint32_t l = 0; l < v.geometry().total_layers(); ++l)
      for (uint32_t t = 0; t < v.geometry().tensors_per_layer(); ++t)
        for (uint32_t b = 0; b < v.geometry().num_blocks; ++b)
          sim::poison_block(v, l, t, b);
  }
  return pools;
}

TEST(EngineMemory, TransfersBetweenEnginesMemfdPoolsLandByteForByteAndFollowAReRegistration) {
  TwoInstances env("engmem", RequestDriver::small_pair());
  std::vector<EnginePool> src = pools_for(env.prefill(), "prefill-memfd");
  std::vector<EnginePool> dst = pools_for(env.decode(), "decode-memfd");
  register_all(env.prefill().client(), src);
  register_all(env.decode().client(), dst);

  // A request whose blocks are filled in the prefill engine's memfds.
  RequestDriver driver(env, RequestDriver::kLayers, RequestDriver::kBlockTokens);
  uint32_t next = 0;
  const auto request = [&](uint32_t n) {
    sim::RequestBlocks r;
    r.tag = 1000 + next;
    for (uint32_t i = 0; i < n; ++i) {
      r.src.push_back(next + i);
      r.dst.push_back(60 + next + i);
    }
    next += n;
    for (uint32_t rank = 0; rank < env.tp(); ++rank)
      sim::fill_request(*src[rank].view, rank, r);
    return r;
  };
  const sim::RequestBlocks first = request(5);
  driver.submit("into-memfds", first, 0);
  driver.layers_done(0, RequestDriver::kLayers);
  Completion c = env.wait_for("into-memfds");
  ASSERT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  for (uint32_t rank = 0; rank < env.tp(); ++rank) {
    EXPECT_EQ(sim::check_request(*dst[rank].view, rank, first), 0U) << "rank " << rank;
    EXPECT_TRUE(sim::block_is_poisoned(env.dst_pool(rank), 0, 0, first.dst[0]))
        << "rank " << rank << ": the worker's own pool, replaced, was written";
    EXPECT_TRUE(sim::block_is_poisoned(*dst[rank].view, 0, 0, 59)) << "a block of no request";
  }

  // The decode engine replaces its pools; the prefill workers hold the old
  // ones' mappings until they see the directory change, then fetch anew.
  std::vector<EnginePool> again = pools_for(env.decode(), "decode-memfd-2");
  register_all(env.decode().client(), again);
  const sim::RequestBlocks second = request(4);
  driver.submit("into-new-memfds", second, 1);
  driver.layers_done(0, RequestDriver::kLayers);
  c = env.wait_for("into-new-memfds");
  ASSERT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  for (uint32_t rank = 0; rank < env.tp(); ++rank) {
    EXPECT_EQ(sim::check_request(*again[rank].view, rank, second), 0U) << "rank " << rank;
    EXPECT_TRUE(sim::block_is_poisoned(*dst[rank].view, 0, 0, second.dst[0]))
        << "rank " << rank << ": written into the pool the engine had replaced";
  }
  env.stop_and_check_clean();
}

// --pool none, as on a GPU server: no worker makes a pool in /dev/shm; a
// transfer submitted before the engines registered theirs fails once, saying
// why; once they have, their pools carry the transfers byte for byte.
TEST(EngineMemory, WithPoolNoneNothingIsInDevShmAndTheEnginesPoolsCarryTheTransfers) {
  Placement where;
  where.engine_pools = true;
  TwoInstances env("engmem-none", RequestDriver::small_pair(), where);
  for (Instance* instance : {&env.prefill(), &env.decode()})
    for (const std::string& segment : instance->leftover_segments())
      EXPECT_EQ(segment.find("-pool-r"), std::string::npos) << "a pool nobody asked for: " << segment;

  uint64_t step = 0;
  const auto send = [&](const std::string& id, const sim::RequestBlocks& r, uint32_t slot) {
    const uint32_t tokens = static_cast<uint32_t>(r.src.size() * RequestDriver::kBlockTokens);
    ASSERT_TRUE(env.submit_task(id, r, tokens, slot));
    ASSERT_TRUE(env.submit_dest(id, r));
    env.prefill_step(++step, {{slot, 0, tokens, Client::request_tag(id)}}, RequestDriver::kLayers);
  };
  sim::RequestBlocks early;
  early.tag = 7;
  early.src = {0, 1};
  early.dst = {10, 11};
  send("before-the-pools", early, 0);
  Completion c = env.wait_for("before-the-pools");
  EXPECT_EQ(c.status, CompletionStatus::kError);
  EXPECT_NE(c.message.find("--pool none"), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("has not registered"), std::string::npos) << c.message;

  std::vector<EnginePool> src = pools_for(env.prefill(), "prefill-memfd");
  std::vector<EnginePool> dst = pools_for(env.decode(), "decode-memfd");
  register_all(env.prefill().client(), src);
  register_all(env.decode().client(), dst);
  sim::RequestBlocks r;
  r.tag = 8;
  r.src = {3, 4, 5};
  r.dst = {40, 41, 42};
  for (uint32_t rank = 0; rank < env.tp(); ++rank)
    sim::fill_request(*src[rank].view, rank, r);
  send("into-the-engines-pools", r, 1);
  c = env.wait_for("into-the-engines-pools");
  ASSERT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  for (uint32_t rank = 0; rank < env.tp(); ++rank) {
    EXPECT_EQ(sim::check_request(*dst[rank].view, rank, r), 0U) << "rank " << rank;
    EXPECT_TRUE(sim::block_is_poisoned(*dst[rank].view, 0, 0, 10)) << "the early request wrote";
  }
  EXPECT_TRUE(env.engine().poll().value() == std::nullopt) << "one completion per request";
  env.stop_and_check_clean();
}

TEST(EngineMemory, ARegistrationWhoseMemfdIsNotSealedFailsWithTheReasonAndTheRankServesOn) {
  TwoInstances env("engmem-bad", RequestDriver::small_pair());
  const PoolGeometry g = env.decode().client().info().device_pool;
  MemfdPool unsealed(g, g.tensors_per_layer(), /*seal=*/false);
  Client& engine = env.decode().client();
  ASSERT_TRUE(engine.register_pool(memfd_pool_spec(unsealed, 1), Deadline::after(5s)));
  Result<Completion> c = engine.wait(Deadline::after(20s));
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->kind, CompletionKind::kRegisterPool);
  EXPECT_EQ(c->status, CompletionStatus::kError);
  EXPECT_EQ(c->error_rank, 1);
  EXPECT_NE(c->message.find("F_SEAL_SHRINK"), std::string::npos) << c->message;

  // The rank still serves its own pool: a transfer into it succeeds.
  RequestDriver driver(env, RequestDriver::kLayers, RequestDriver::kBlockTokens);
  const sim::RequestBlocks r = driver.blocks(3);
  driver.submit("after-refusal", r, 0);
  driver.layers_done(0, RequestDriver::kLayers);
  const Completion done = env.wait_for("after-refusal");
  EXPECT_EQ(done.status, CompletionStatus::kFinished) << done.message;
  EXPECT_EQ(env.wrong_words(r), 0U);
  env.stop_and_check_clean();
}

TEST(EngineMemory, AGpuRegistrationByAddressIsRefusedClearlyWithoutAGpu) {
  TwoInstances env("engmem-gpu", RequestDriver::small_pair());
  Client& engine = env.decode().client();
  const PoolGeometry g = engine.info().device_pool;
  std::vector<uint64_t> addresses(g.total_layers() * g.tensors_per_layer(), 0x7f0000000000ULL);
  if (kernels::cuda_device_usable(0).ok())
    GTEST_SKIP() << "a GPU is here: the GPU tests cover registration by address";
  const Status s = engine.register_cuda_pool(0, PoolTier::kDevice, addresses, Deadline::after(5s));
  EXPECT_EQ(s.code(), Errc::kUnsupported) << s.error().message;
  EXPECT_EQ(
      engine
          .register_cuda_pool(0, PoolTier::kDevice, std::span<const uint64_t>(addresses).first(3),
                              Deadline::after(5s))
          .code(),
      Errc::kInvalidArgument)
      << "the count of tensors is checked first";
  env.stop_and_check_clean();
}

}  // namespace
}  // namespace kvrelay::testing
