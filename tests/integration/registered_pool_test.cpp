// A decode engine that registers pools of its own (RegisterPool) after the
// prefill instance has already sent into the ones kvrelay made: the next
// transfers land in the engine's pools (the prefill side maps them afresh),
// and the pools kvrelay made are no longer left behind in /dev/shm.
#include <gtest/gtest.h>

#include <filesystem>

#include "client/views.h"
#include "instance/names.h"
#include "instance/pool_segment.h"
#include "integration/request_driver.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

bool segment_exists(const std::string& name) {
  return std::filesystem::exists("/dev/shm/" + name);
}

TEST(RegisteredPools, TransfersAfterADecodeEngineRegistersItsOwnPoolsLandInThem) {
  TwoInstances env("regpool", RequestDriver::small_pair());
  RequestDriver driver(env, RequestDriver::kLayers, RequestDriver::kBlockTokens);
  sim::RequestBlocks first = driver.blocks(3);
  driver.submit("before", first, 0);
  driver.layers_done(0, RequestDriver::kLayers);
  ASSERT_EQ(env.wait_for("before").status, CompletionStatus::kFinished);
  ASSERT_EQ(env.wrong_words(first), 0u);

  Client& decode_engine = env.decode().client();
  const std::string decode = env.decode().name();
  std::vector<std::unique_ptr<PoolView>> mine;  // the engine's own pools
  std::vector<std::string> replaced;
  for (uint32_t rank = 0; rank < env.tp(); ++rank) {
    const std::string name = pool_segment_name(decode, "engine", rank);
    const PoolGeometry g = decode_engine.info().device_pool;
    Result<HostPool> pool = HostPool::create(name, rank, PoolTier::kDevice, g);
    ASSERT_TRUE(pool) << pool.error().message;
    mine.push_back(std::make_unique<PoolView>(pool_view_of(std::move(pool).value())));
    for (uint32_t l = 0; l < g.total_layers(); ++l)
      for (uint32_t t = 0; t < g.tensors_per_layer(); ++t)
        for (uint32_t b = 0; b < g.num_blocks; ++b)
          sim::poison_block(*mine.back(), l, t, b);
    replaced.push_back(env.dst_pool(rank).segment_name());
    PoolSpec spec;
    spec.rank = rank;
    spec.segment_name = name;  // a device-tier segment
    ASSERT_TRUE(decode_engine.register_pool(spec, Deadline::after(5s)));
    Result<Completion> c = decode_engine.wait(Deadline::after(20s));
    ASSERT_TRUE(c) << c.error().message;
    EXPECT_EQ(c->kind, CompletionKind::kRegisterPool);
    EXPECT_EQ(c->status, CompletionStatus::kFinished) << c->message;
  }
  for (const std::string& name : replaced)
    EXPECT_FALSE(segment_exists(name)) << name << ": kvrelay's own pool, replaced, is left behind";

  sim::RequestBlocks second = driver.blocks(4);
  driver.submit("after", second, 1);
  driver.layers_done(0, RequestDriver::kLayers);
  const Completion c = env.wait_for("after");
  EXPECT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  for (uint32_t rank = 0; rank < env.tp(); ++rank) {
    EXPECT_EQ(sim::check_request(*mine[rank], rank, second), 0u) << "rank " << rank;
    for (uint32_t b : second.dst)
      EXPECT_TRUE(sim::block_is_poisoned(env.dst_pool(rank), 0, 0, b))
          << "rank " << rank << " still wrote into the replaced pool";
  }
  for (const auto& p : mine)
    (void)SharedSegment::unlink(p->segment_name());
  env.stop_and_check_clean();
}

}  // namespace
}  // namespace kvrelay::testing
