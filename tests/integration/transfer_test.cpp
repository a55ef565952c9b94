// Layer-wise prefill->decode transfer across real processes.
//
// The randomized differential test runs a small reference model of DESIGN.md
// section 5 beside the real processes. After every engine step it waits until
// the prefill workers have copied exactly the bytes the model expects, then
// compares the decode pools with the model block by block, layer by layer:
// every block the model says has arrived must hold its pattern, every other
// block must still hold the poison it started with. Blocks carry the pattern
// of each model KV head, so the same model checks heterogeneous TP (another
// decode TP size): every head of every block on exactly the decode ranks
// that hold it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <random>

#include "instance/control_layout.h"
#include "instance/control_segment.h"
#include "integration/tcp_hosts.h"
#include "integration/two_instances.h"
#include "shm/counters.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

// Sum of the prefill workers' bytes_copied counters.
uint64_t copied_bytes(const std::string& instance) {
  return worker_counter_sum(instance, "bytes_copied");
}

// The reference model of one request (DESIGN.md section 5, points 2-5).
struct ModelRequest {
  std::string id;
  sim::RequestBlocks blocks;
  uint32_t slot = 0;
  uint64_t tokens = 0;     // need_prefill_tokens
  uint64_t prefilled = 0;  // after the steps so far
  bool dest_sent = false;
  bool task_sent = false;
  std::vector<uint64_t> layer_tokens;  // tokens computed per layer
  uint32_t computed(uint32_t layer, uint32_t block_tokens) const {
    const auto n = static_cast<uint32_t>(blocks.src.size());
    if (layer_tokens[layer] >= tokens) return n;
    return std::min<uint32_t>(static_cast<uint32_t>(layer_tokens[layer] / block_tokens), n);
  }
  // Destination blocks of `layer` that must have arrived.
  uint32_t arrived(uint32_t layer, uint32_t block_tokens) const {
    if (!dest_sent || !task_sent) return 0;
    const uint32_t c = computed(layer, block_tokens);
    return c > blocks.prefix() ? c - blocks.prefix() : 0;
  }
};

class Differential {
 public:
  // `block_bytes`: one decode block of every tensor of a layer together (K,
  // V and the scales of fp8 pools; K alone in a K-only pool).
  Differential(TwoInstances& env, uint32_t layers, uint32_t block_tokens, uint64_t block_bytes)
      : env_(env), layers_(layers), bt_(block_tokens), block_bytes_(block_bytes) {}

  void poison_all() {
    std::vector<const PoolView*> pools;
    for (uint32_t rank = 0; rank < env_.tp(); ++rank) pools.push_back(&env_.src_pool(rank));
    for (uint32_t rank = 0; rank < env_.decode_tp(); ++rank) pools.push_back(&env_.dst_pool(rank));
    {
      for (const PoolView* pool : pools) {
        const PoolGeometry& g = pool->geometry();
        for (uint32_t l = 0; l < g.total_layers(); ++l)
          for (uint32_t t : sim::tensor_ids(g))
            for (uint32_t b = 0; b < g.blocks_in_layer(l); ++b)
              sim::poison_block(*pool, l, t, b);
      }
    }
  }

  uint64_t expected_bytes() const {
    uint64_t blocks = 0;
    for (const auto& [id, r] : requests)
      for (uint32_t l = 0; l < layers_; ++l)
        blocks += r.arrived(l, bt_);
    return blocks * block_bytes_ * env_.decode_tp();
  }

  // Waits for the workers to have copied what the model expects, then
  // compares every decode block of every layer with the model.
  void check(const std::string& when) {
    const uint64_t want = expected_bytes();
    const Deadline until = Deadline::after(20s);
    uint64_t got = copied_bytes(env_.prefill().name());
    while (got < want && !until.passed()) {
      std::this_thread::sleep_for(2ms);
      got = copied_bytes(env_.prefill().name());
    }
    ASSERT_EQ(got, want) << when << ": bytes copied by the workers vs the model";
    std::map<uint32_t, std::pair<const ModelRequest*, uint32_t>>
        owner;  // dst block -> (request, index)
    for (const auto& [id, r] : requests)
      for (uint32_t j = 0; j < r.blocks.dst.size(); ++j)
        owner[r.blocks.dst[j]] = {&r, j};
    for (uint32_t rank = 0; rank < env_.decode_tp(); ++rank) {
      const PoolView& dst = env_.dst_pool(rank);
      const uint32_t first_head = env_.dst_first_head(rank);
      for (uint32_t l = 0; l < layers_; ++l) {
        for (uint32_t b = 0; b < dst.geometry().blocks_in_layer(l); ++b) {
          auto it = owner.find(b);
          const bool should_arrive =
              it != owner.end() && it->second.second < it->second.first->arrived(l, bt_);
          for (uint32_t t : sim::tensor_ids(dst.geometry())) {
            if (should_arrive) {
              const ModelRequest& r = *it->second.first;
              const uint32_t index = r.blocks.prefix() + it->second.second;
              ASSERT_EQ(sim::check_block_heads(dst, b, sim::BlockTag{r.blocks.tag, l, t, index, 0},
                                               first_head),
                        0u)
                  << when << ": block " << b << " layer " << l << " tensor " << t << " rank "
                  << rank << " of '" << r.id << "' should have arrived";
            } else {
              ASSERT_TRUE(sim::block_is_poisoned(dst, l, t, b))
                  << when << ": block " << b << " layer " << l << " tensor " << t << " rank "
                  << rank << " was written but should not have been";
            }
          }
        }
      }
    }
  }

  std::map<std::string, ModelRequest> requests;

 private:
  TwoInstances& env_;
  uint32_t layers_;
  uint32_t bt_;
  uint64_t block_bytes_;
};

struct Scenario {
  uint32_t tp = 2;
  uint32_t layers = 4;
  uint32_t extra_layers = 0;
  uint32_t block_tokens = 16;
  uint32_t blocks = 96;
  std::string dtype = "bfloat16";
  // Heterogeneous TP: the decode instance's TP size (0: tp) and the model's
  // KV heads (0: one per prefill rank).
  uint32_t decode_tp = 0;
  uint32_t total_heads = 0;
  bool k_only = false;  // no V: an MLA latent cache (with total_heads 1)
  uint32_t heads() const { return total_heads != 0 ? total_heads : tp; }
  Placement placement() const {
    Placement p;
    p.decode_tp = decode_tp;
    if (decode_tp != 0) p.decode_kv_heads = std::max(1u, heads() / decode_tp);
    return p;
  }
};

InstanceArgs args_of(const Scenario& s) {
  InstanceArgs a;
  a.tp = s.tp;
  a.layers = s.layers;
  a.extra_layers = s.extra_layers;
  a.block_size = s.block_tokens;
  a.blocks = s.blocks;
  a.head_dim = 16;
  a.dtype = s.dtype;
  a.kv_heads = std::max(1u, s.heads() / s.tp);
  a.extra = {"--total-kv-heads", std::to_string(s.heads())};
  if (s.k_only) a.extra.push_back("--k-only");
  return a;
}

// Runs a random schedule of `requests` requests on `slots` slots, checking the
// decode pools against the model after every step; with `tcp`, the decode
// instance is on another host and the blocks travel over tcp.
void run_random_schedule(const Scenario& s, uint64_t seed, uint32_t requests, uint32_t slots,
                         TcpHosts* tcp = nullptr) {
  TwoInstances env("diff" + std::to_string(seed), args_of(s),
                   tcp != nullptr ? tcp->placement() : s.placement());
  if (tcp != nullptr) env.set_route(tcp->route());
  const PoolGeometry& g = env.src_pool(0).geometry();
  ASSERT_EQ(g.k_only, s.k_only ? 1u : 0u);
  ASSERT_EQ(g.tensors_per_layer(), (s.k_only ? 1u : 2u) * (s.dtype == "fp8" ? 2u : 1u));
  uint64_t layer_block_bytes = 0;
  for (uint32_t t : sim::tensor_ids(g))
    layer_block_bytes += env.dst_pool(0).geometry().block_bytes(static_cast<PoolTensor>(t));
  Differential model(env, g.total_layers(), s.block_tokens, layer_block_bytes);
  model.poison_all();
  std::mt19937_64 rng(seed);
  auto pick = [&](uint32_t lo, uint32_t hi) {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
  };

  // Requests with disjoint blocks on both sides.
  std::vector<std::string> order;
  uint32_t next_src = 0, next_dst = 0;
  for (uint32_t i = 0; i < requests; ++i) {
    ModelRequest r;
    r.id = "q" + std::to_string(seed) + "-" + std::to_string(i);
    r.tokens = pick(1, 5 * s.block_tokens);
    const uint32_t n = static_cast<uint32_t>((r.tokens + s.block_tokens - 1) / s.block_tokens);
    const uint32_t cached = pick(0, 2) == 0 ? pick(0, n) : 0;  // a third hit the prefix cache
    r.blocks.tag = i + 1;
    for (uint32_t b = 0; b < n; ++b)
      r.blocks.src.push_back(next_src++);
    for (uint32_t b = cached; b < n; ++b)
      r.blocks.dst.push_back(next_dst++);
    if (pick(0, 1) == 1)
      std::shuffle(r.blocks.dst.begin(), r.blocks.dst.end(), rng);  // scattered ids
    r.layer_tokens.assign(g.total_layers(), 0);
    order.push_back(r.id);
    model.requests[r.id] = r;
  }
  ASSERT_LE(next_src, s.blocks);
  ASSERT_LE(next_dst, s.blocks);

  std::vector<std::string> waiting = order, active;
  uint64_t step = 0;
  auto submit_dest = [&](ModelRequest& r) {
    ASSERT_TRUE(env.submit_dest(r.id, r.blocks).ok());
    r.dest_sent = true;
  };
  while (!waiting.empty() || !active.empty()) {
    ++step;
    // Admit into free slots; the task goes before, during (after the batch
    // record) or after the step's signals; the decode half now or later.
    std::vector<std::pair<ModelRequest*, int>> late_tasks;  // 0: after batch, 1: after the step
    while (!waiting.empty() && active.size() < slots) {
      ModelRequest& r = model.requests[waiting.front()];
      waiting.erase(waiting.begin());
      std::vector<uint32_t> used;
      for (const auto& id : active)
        used.push_back(model.requests[id].slot);
      for (r.slot = 0; std::find(used.begin(), used.end(), r.slot) != used.end(); ++r.slot) {
      }
      active.push_back(r.id);
      const int when = static_cast<int>(pick(0, 2));
      if (when == 0) {
        ASSERT_TRUE(env.submit_task(r.id, r.blocks, r.tokens, r.slot).ok());
        r.task_sent = true;
      } else {
        late_tasks.emplace_back(&r, when - 1);
      }
      if (pick(0, 3) == 0) submit_dest(r);
    }
    std::vector<BatchSlot> batch;
    std::vector<std::pair<ModelRequest*, uint64_t>> chunks;
    for (const auto& id : active) {
      ModelRequest& r = model.requests[id];
      const uint64_t len = std::min<uint64_t>(r.tokens - r.prefilled, pick(1, 3 * s.block_tokens));
      batch.push_back({r.slot, static_cast<uint32_t>(r.prefilled), static_cast<uint32_t>(len),
                       Client::request_tag(r.id)});
      chunks.emplace_back(&r, len);
    }
    for (uint32_t rank = 0; rank < env.tp(); ++rank)
      ASSERT_TRUE(env.engine().push_batch(rank, step, batch, Deadline::after(5s)).ok());
    for (auto& [r, when] : late_tasks) {
      if (when == 0) {
        ASSERT_TRUE(env.submit_task(r->id, r->blocks, r->tokens, r->slot).ok());
        r->task_sent = true;
      }
    }
    for (uint32_t l = 0; l < g.total_layers(); ++l) {
      for (auto& [r, len] : chunks) {
        const uint32_t first = static_cast<uint32_t>(r->prefilled / s.block_tokens);
        const uint32_t last = std::min<uint32_t>(
            static_cast<uint32_t>((r->prefilled + len + s.block_tokens - 1) / s.block_tokens),
            static_cast<uint32_t>(r->blocks.src.size()));
        for (uint32_t rank = 0; rank < env.tp(); ++rank)
          for (uint32_t t : sim::tensor_ids(g))
            for (uint32_t i = first; i < last; ++i)
              sim::fill_block_heads(env.src_pool(rank), r->blocks.src[i],
                                    sim::BlockTag{r->blocks.tag, l, t, i, 0},
                                    env.src_first_head(rank));
        r->layer_tokens[l] = r->prefilled + len;
      }
      for (uint32_t rank = 0; rank < env.tp(); ++rank)
        ASSERT_TRUE(env.engine().push_layer_done(rank, step, l, Deadline::after(5s)).ok());
    }
    for (auto& [r, when] : late_tasks) {
      if (when == 1) {
        ASSERT_TRUE(env.submit_task(r->id, r->blocks, r->tokens, r->slot).ok());
        r->task_sent = true;
      }
    }
    for (auto& [r, len] : chunks)
      r->prefilled += len;
    // Prefilled requests leave their slot; some send their decode half only now.
    std::erase_if(active, [&](const std::string& id) {
      return model.requests[id].prefilled == model.requests[id].tokens;
    });
    for (auto& [id, r] : model.requests)
      if (r.task_sent && !r.dest_sent && r.prefilled == r.tokens && pick(0, 1) == 0) submit_dest(r);
    model.check("after step " + std::to_string(step));
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (auto& [id, r] : model.requests)
    if (!r.dest_sent) submit_dest(r);
  model.check("at the end");
  // Exactly one completion per request, every one finished.
  std::map<std::string, int> seen;
  for (size_t i = 0; i < model.requests.size(); ++i) {
    auto c = env.engine().wait(Deadline::after(20s));
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->status, CompletionStatus::kFinished) << c->request_id << ": " << c->message;
    ++seen[c->request_id];
  }
  EXPECT_EQ(env.engine().wait(Deadline::after(200ms)).code(), Errc::kTimeout)
      << "no extra completion";
  for (const auto& [id, r] : model.requests)
    EXPECT_EQ(seen[id], 1) << id;
  env.stop_and_check_clean();
}

class RandomizedDifferential : public ::testing::TestWithParam<uint64_t> {};

TEST_P(RandomizedDifferential, RealProcessesMatchTheReferenceModelAfterEveryStep) {
  run_random_schedule(Scenario{}, GetParam(), 10, 3);
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomizedDifferential, ::testing::Values(1u, 2u, 3u, 4u, 5u, 6u));

TEST(Transfer, Fp8PoolsCarryTheirScalesAlong) {
  Scenario s;
  s.dtype = "fp8";
  run_random_schedule(s, 101, 6, 2);
}

TEST(Transfer, SpeculativeExtraLayersAreSentLikeTheOthers) {
  Scenario s;
  s.extra_layers = 2;
  run_random_schedule(s, 102, 6, 2);
}

// The same model, the decode instance on another host, over tcp: chunked
// prefill, prefix hits, late decode halves, scattered ids.
class TcpDifferential : public ::testing::TestWithParam<uint64_t> {};

TEST_P(TcpDifferential, AcrossTwoHostsTheDecodePoolsMatchTheModelAfterEveryStep) {
  TcpHosts hosts("tdiff", 2);
  run_random_schedule(Scenario{}, 200 + GetParam(), 10, 3, &hosts);
}

INSTANTIATE_TEST_SUITE_P(Seeds, TcpDifferential, ::testing::Values(1u, 2u));

TEST(TcpTransfer, Fp8ScalesAndExtraLayersTravelOverTcpToo) {
  Scenario s;
  s.dtype = "fp8";
  s.extra_layers = 1;
  TcpHosts hosts("tfp8", 2);
  run_random_schedule(s, 210, 6, 2, &hosts);
}

TEST(Transfer, FourRanksEachMoveTheirOwnShard) {
  Scenario s;
  s.tp = 4;
  run_random_schedule(s, 103, 6, 3);
}

// Heterogeneous TP: (prefill tp, decode tp, the model's KV heads).
class HeteroTpDifferential
    : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t, uint32_t>> {};

TEST_P(HeteroTpDifferential, EveryHeadLandsOnExactlyTheDecodeRanksThatHoldIt) {
  const auto [prefill_tp, decode_tp, heads] = GetParam();
  Scenario s;
  s.tp = prefill_tp;
  s.decode_tp = decode_tp;
  s.total_heads = heads;
  run_random_schedule(s, 500 + prefill_tp * 10 + decode_tp, 8, 3);
}

INSTANTIATE_TEST_SUITE_P(
    Splits, HeteroTpDifferential,
    ::testing::Values(std::tuple{1u, 2u, 4u}, std::tuple{2u, 1u, 4u}, std::tuple{2u, 4u, 4u},
                      std::tuple{4u, 2u, 4u}, std::tuple{1u, 4u, 4u}, std::tuple{1u, 4u, 2u},
                      std::tuple{4u, 1u, 2u}),
    [](const auto& split) {
      return fmt::format("tp{}_to_tp{}_{}_heads", std::get<0>(split.param),
                         std::get<1>(split.param), std::get<2>(split.param));
    });

// MLA latent caches: K only, one KV head in all, which every rank of both
// instances holds whole. Each decode rank gets each block from exactly one
// prefill rank, and the bytes the workers copy are exactly decode_tp x one
// rank's latent (Differential::check compares the counters with that):
// never a block twice to one rank. (prefill tp, decode tp, fp8 with scales)
class KOnlyDifferential
    : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t, bool>> {};

TEST_P(KOnlyDifferential, EveryRankGetsTheWholeLatentOnceAndNothingElse) {
  const auto [prefill_tp, decode_tp, fp8] = GetParam();
  Scenario s;
  s.tp = prefill_tp;
  s.decode_tp = decode_tp;
  s.total_heads = 1;
  s.k_only = true;
  if (fp8) s.dtype = "fp8";
  run_random_schedule(s, 700 + prefill_tp * 10 + decode_tp + (fp8 ? 100 : 0), 8, 3);
}

INSTANTIATE_TEST_SUITE_P(
    Mla, KOnlyDifferential,
    ::testing::Values(std::tuple{2u, 2u, false}, std::tuple{2u, 4u, false},
                      std::tuple{4u, 2u, false}, std::tuple{1u, 4u, false},
                      std::tuple{4u, 1u, false}, std::tuple{2u, 2u, true}),
    [](const auto& split) {
      return fmt::format("tp{}_to_tp{}{}", std::get<0>(split.param), std::get<1>(split.param),
                         std::get<2>(split.param) ? "_fp8" : "");
    });

// ---- specific cases ----

class TransferCase : public ::testing::Test {
 protected:
  void SetUp() override {
    InstanceArgs a;
    a.tp = 2;
    a.layers = 3;
    a.block_size = 16;
    a.blocks = 1100;
    a.head_dim = 8;
    env_ = std::make_unique<TwoInstances>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), a);
  }
  void TearDown() override {
    if (env_) env_->stop_and_check_clean();
  }
  std::unique_ptr<TwoInstances> env_;
};

TEST_F(TransferCase, SignalsThatArriveBeforeTheTaskAreNotLost) {
  sim::RequestBlocks r{1, {3, 4, 5}, {7, 8, 9}};
  env_->fill(r);
  env_->prefill_step(1, {{2, 0, 48, Client::request_tag("early")}}, 3);  // the whole prefill first
  ASSERT_TRUE(env_->submit_task("early", r, 48, 2).ok());
  ASSERT_TRUE(env_->submit_dest("early", r).ok());
  EXPECT_EQ(env_->wait_for("early").status, CompletionStatus::kFinished);
  EXPECT_EQ(env_->wrong_words(r), 0u);
}

TEST_F(TransferCase, DecodeHalfArrivingAfterPrefillFinishedCatchesUpAtOnce) {
  sim::RequestBlocks r{2, {10, 11}, {20, 21}};
  env_->fill(r);
  ASSERT_TRUE(env_->submit_task("late-dest", r, 32, 0).ok());
  env_->prefill_step(1, {{0, 0, 32, Client::request_tag("late-dest")}}, 3);
  std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(env_->submit_dest("late-dest", r).ok());
  EXPECT_EQ(env_->wait_for("late-dest").status, CompletionStatus::kFinished);
  EXPECT_EQ(env_->wrong_words(r), 0u);
}

TEST_F(TransferCase, LastChunkShorterThanABlockStillSendsThePartialBlock) {
  sim::RequestBlocks r{3, {30, 31, 32}, {40, 41, 42}};  // 35 tokens: 2 full blocks + 3 tokens
  env_->fill(r);
  ASSERT_TRUE(env_->submit_task("short-tail", r, 35, 1).ok());
  ASSERT_TRUE(env_->submit_dest("short-tail", r).ok());
  env_->prefill_step(1, {{1, 0, 32, Client::request_tag("short-tail")}}, 3);
  env_->prefill_step(2, {{1, 32, 3, Client::request_tag("short-tail")}}, 3);
  EXPECT_EQ(env_->wait_for("short-tail").status, CompletionStatus::kFinished);
  EXPECT_EQ(env_->wrong_words(r), 0u);
}

TEST_F(TransferCase, EntirelyPrefixCachedDestinationSendsNothingAndCompletesOnce) {
  sim::RequestBlocks r{4, {50, 51}, {}};
  ASSERT_TRUE(env_->submit_task("all-cached", r, 32, 3).ok());
  ASSERT_TRUE(env_->submit_dest("all-cached", r).ok());
  env_->prefill_step(1, {{3, 0, 32, Client::request_tag("all-cached")}}, 3);
  const Completion c = env_->wait_for("all-cached");
  EXPECT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  EXPECT_EQ(c.bytes_moved, 0u);
  EXPECT_EQ(c.first_copy_ns, 0u) << "nothing was copied";
  EXPECT_EQ(env_->engine().wait(Deadline::after(200ms)).code(), Errc::kTimeout);
}

TEST_F(TransferCase, BatchOfFiveHundredTwelveSlotsInOneStep) {
  std::vector<sim::RequestBlocks> reqs;
  std::vector<BatchSlot> batch;
  for (uint32_t slot = 0; slot < 512; ++slot) {
    sim::RequestBlocks r{100 + slot, {slot * 2, slot * 2 + 1}, {slot * 2 + 1, slot * 2}};
    env_->fill(r);
    const std::string id = "b" + std::to_string(slot);
    ASSERT_TRUE(env_->submit_task(id, r, 20, slot).ok());
    ASSERT_TRUE(env_->submit_dest(id, r).ok());
    batch.push_back({slot, 0, 20, Client::request_tag(id)});
    reqs.push_back(r);
  }
  env_->prefill_step(1, batch, 3);
  for (uint32_t slot = 0; slot < 512; ++slot) {
    const Completion c = env_->wait_for("b" + std::to_string(slot), 60s);
    ASSERT_EQ(c.status, CompletionStatus::kFinished) << c.request_id << ": " << c.message;
  }
  uint64_t wrong = 0;
  for (const auto& r : reqs)
    wrong += env_->wrong_words(r);
  EXPECT_EQ(wrong, 0u);
}

TEST_F(TransferCase, LegacyPerQueryModeSendsEachLayerAsTheStepPassesIt) {
  sim::RequestBlocks r{5, {60, 61}, {70, 71}};
  env_->fill(r);
  CacheTaskSpec t;
  t.request_id = "legacy";
  t.src_block_ids = r.src;
  t.need_prefill_tokens = 20;
  t.legacy_prefill_step = 7;
  ASSERT_TRUE(env_->engine().submit(t, Deadline::after(5s)).ok());
  ASSERT_TRUE(env_->submit_dest("legacy", r).ok());
  for (uint32_t rank = 0; rank < 2; ++rank)
    for (uint32_t l = 0; l < 3; ++l)
      ASSERT_TRUE(env_->engine().push_legacy_layer_done(rank, 7, l, Deadline::after(5s)).ok());
  EXPECT_EQ(env_->wait_for("legacy").status, CompletionStatus::kFinished);
  EXPECT_EQ(env_->wrong_words(r), 0u);
}

}  // namespace
}  // namespace kvrelay::testing
