// One decode instance fed by many prefill instances at once (an xPyD
// deployment: sixteen prefill instances into one decode instance), over ipc on
// one host and over tcp between two. All the prefill engines submit, then
// all signal their layers together, so every transfer is in flight at once
// into the one decode pool. Each request must move every byte into its own
// destination blocks and get exactly one completion, on its own engine,
// and one `arrived` on the decode engine, which declared each request as
// coming from its own prefill instance;
// nothing outside the requests' blocks may change; and every instance must
// stop cleanly afterwards.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "integration/tcp_hosts.h"
#include "integration/two_instances.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr uint32_t kPrefillInstances = 4;  // each process runs several times slower
#else
constexpr uint32_t kPrefillInstances = 16;
#endif
constexpr uint32_t kLayers = 4;
constexpr uint32_t kBlockTokens = 16;
constexpr uint32_t kBlocksEach = 24;  // per request, one request per prefill instance

InstanceArgs instance_args(const std::string& name, const std::string& role, uint32_t blocks) {
  InstanceArgs a;
  a.instance = name;
  a.role = role;
  a.tp = 1;
  a.layers = kLayers;
  a.blocks = blocks;
  a.block_size = kBlockTokens;
  a.head_dim = 64;
  return a;
}

struct PrefillSide {
  std::unique_ptr<Instance> instance;
  std::unique_ptr<PoolView> src;
  sim::RequestBlocks request;
  std::string id;
};

class ManyPrefillInstances : public ::testing::TestWithParam<Protocol> {};

TEST_P(ManyPrefillInstances, IntoOneDecodeInstanceEveryByteLandsOnceWithOneCompletionEach) {
  const bool tcp = GetParam() == Protocol::kTcp;
  const std::string tag = current_test_instance();
  std::unique_ptr<TcpHosts> hosts;
  Placement where;
  Route route;
  if (tcp) {
    hosts = std::make_unique<TcpHosts>(tag, 1);
    where = hosts->placement();
    route = hosts->route();
  }

  InstanceArgs d =
      instance_args(unique_instance(tag + "-d"), "decode", kPrefillInstances * kBlocksEach + 16);
  d.prefix = where.decode_prefix;
  d.extra = where.decode_extra;
  std::unique_ptr<Instance> decode = Instance::start(d);
  PoolView dst = std::move(decode->client().open_pool(0, PoolTier::kDevice)).value();
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t t = 0; t < 2; ++t)
      for (uint32_t b = 0; b < dst.geometry().num_blocks; ++b)
        sim::poison_block(dst, l, t, b);

  std::vector<PrefillSide> prefills(kPrefillInstances);
  for (uint32_t i = 0; i < kPrefillInstances; ++i) {
    PrefillSide& p = prefills[i];
    InstanceArgs a =
        instance_args(unique_instance(tag + "-p" + std::to_string(i)), "prefill", kBlocksEach + 8);
    a.prefix = where.prefill_prefix;
    a.extra = where.prefill_extra;
    p.instance = Instance::start(a);
    p.src = std::make_unique<PoolView>(
        std::move(p.instance->client().open_pool(0, PoolTier::kDevice)).value());
    p.id = "many-" + std::to_string(i);
    p.request.tag = i + 1;
    for (uint32_t b = 0; b < kBlocksEach; ++b) {
      // Each instance sends its own source blocks (reversed on odd ones) to
      // its own stretch of the decode pool, interleaved with the others'.
      p.request.src.push_back(i % 2 == 0 ? b : kBlocksEach - 1 - b);
      p.request.dst.push_back(b * kPrefillInstances + i);
    }
    sim::fill_request(*p.src, 0, p.request);
  }

  // The decode engine declares every request, each from its own sender
  // only, and must hear `arrived` once for each.
  for (const PrefillSide& p : prefills) {
    ExpectSpec e;
    e.request_id = p.id;
    e.dest_block_ids = p.request.dst;
    e.from_instance = p.instance->name();
    ASSERT_TRUE(decode->client().submit(e, Deadline::after(5s)).ok()) << p.id;
  }

  // Every prefill engine submits both halves, then every one signals: the
  // transfers run at once.
  for (PrefillSide& p : prefills) {
    Client& engine = p.instance->client();
    CacheTaskSpec t;
    t.request_id = p.id;
    t.src_block_ids = p.request.src;
    t.need_prefill_tokens = kBlocksEach * kBlockTokens;
    t.engine_slot = 0;
    ASSERT_TRUE(engine.submit(t, Deadline::after(5s)).ok()) << p.id;
    CacheDestSpec dest;
    dest.request_id = p.id;
    dest.dest_block_ids = p.request.dst;
    dest.protocol = tcp ? Protocol::kTcp : Protocol::kIpc;
    dest.peer_instance = decode->name();
    dest.peer_address = route.address;
    dest.tcp_ports = route.ports;
    dest.device_ids = {0};
    ASSERT_TRUE(engine.submit(dest, Deadline::after(5s)).ok()) << p.id;
    const std::vector<BatchSlot> batch = {
        {0, 0, kBlocksEach * kBlockTokens, Client::request_tag(p.id)}};
    ASSERT_TRUE(engine.push_batch(0, 1, batch, Deadline::after(5s)).ok()) << p.id;
  }
  for (uint32_t l = 0; l < kLayers; ++l)
    for (PrefillSide& p : prefills)
      ASSERT_TRUE(p.instance->client().push_layer_done(0, 1, l, Deadline::after(5s)).ok());

  for (PrefillSide& p : prefills) {
    Result<Completion> c = p.instance->client().wait(Deadline::after(60s));
    ASSERT_TRUE(c.ok()) << p.id << ": " << c.error().message;
    EXPECT_EQ(c->request_id, p.id);
    EXPECT_EQ(c->status, CompletionStatus::kFinished) << p.id << ": " << c->message;
  }
  // Exactly one each: nothing more comes on any engine.
  std::this_thread::sleep_for(200ms);
  for (PrefillSide& p : prefills) {
    Result<std::optional<Completion>> extra = p.instance->client().poll();
    ASSERT_TRUE(extra.ok()) << extra.error().message;
    EXPECT_FALSE(extra->has_value())
        << p.id << " got a second completion: " << (extra->has_value() ? (*extra)->request_id : "");
  }

  std::set<std::string> arrived;
  for (uint32_t i = 0; i < kPrefillInstances; ++i) {
    Result<Completion> c = decode->client().wait(Deadline::after(30s));
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->kind, CompletionKind::kArrived) << c->request_id;
    EXPECT_EQ(c->status, CompletionStatus::kFinished) << c->request_id << ": " << c->message;
    EXPECT_TRUE(arrived.insert(c->request_id).second) << c->request_id << " arrived twice";
  }
  EXPECT_EQ(arrived.size(), kPrefillInstances);
  std::this_thread::sleep_for(100ms);
  Result<std::optional<Completion>> late = decode->client().poll();
  ASSERT_TRUE(late.ok()) << late.error().message;
  EXPECT_FALSE(late->has_value()) << "an extra decode-side completion: "
                                  << (late->has_value() ? (*late)->request_id : "");

  for (const PrefillSide& p : prefills)
    EXPECT_EQ(sim::check_request(dst, 0, p.request), 0u) << p.id;
  uint64_t stray = 0;
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t t = 0; t < 2; ++t)
      for (uint32_t b = kPrefillInstances * kBlocksEach; b < dst.geometry().num_blocks; ++b)
        if (!sim::block_is_poisoned(dst, l, t, b)) ++stray;
  EXPECT_EQ(stray, 0u) << "decode blocks outside every request were written";

  for (PrefillSide& p : prefills) {
    p.src.reset();
    EXPECT_EQ(p.instance->stop(), 0);
    EXPECT_TRUE(p.instance->leftover_segments().empty());
  }
  EXPECT_EQ(decode->stop(), 0);
  EXPECT_TRUE(decode->leftover_segments().empty());
}

INSTANTIATE_TEST_SUITE_P(Protocols, ManyPrefillInstances,
                         ::testing::Values(Protocol::kIpc, Protocol::kTcp),
                         [](const auto& param_info) {
                           return std::string(param_info.param == Protocol::kTcp ? "Tcp" : "Ipc");
                         });

}  // namespace
}  // namespace kvrelay::testing
