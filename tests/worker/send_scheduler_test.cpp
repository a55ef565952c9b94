// SendScheduler with a recording destination: which layers of which blocks
// move on which signal, per DESIGN.md section 5.
#include "worker/send_scheduler.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "shm/clock.h"

namespace kvrelay::worker {
namespace {

using records::LayerSignal;
using records::ReportKind;
using records::SignalKind;

// Records every (layer, dst block) handed over, and completes each transfer
// through `sink` (at once, or when the test says: see FakeTransport).
class RecordingDestination : public Destination {
 public:
  explicit RecordingDestination(std::function<void(TransferCompletion)> sink)
      : sink_(std::move(sink)) {}
  uint32_t blocks_in_layer(uint32_t) const override { return 1024; }
  const std::string& peer() const override { return name_; }
  Status submit_layer(const TransferTicket& ticket, uint32_t layer,
                      std::span<const BlockRun> runs) override {
    if (refuse_layer && *refuse_layer == layer)
      return make_error(Errc::kInvalidArgument, "refused by the test");
    uint64_t n = 0;
    for (const BlockRun& r : runs)
      for (uint32_t i = 0; i < r.count; ++i) {
        written.insert({layer, r.dst_block + i});
        ++n;
      }
    ++copies;
    sink_(TransferCompletion{ticket, n * 100, {}});
    return {};
  }
  std::set<std::pair<uint32_t, uint32_t>> written;
  int copies = 0;
  std::optional<uint32_t> refuse_layer;

 private:
  std::function<void(TransferCompletion)> sink_;
  std::string name_ = "the fake peer";
};

// Completes transfers at once, or, when `deferred`, only when release() says
// so: the scheduler then sees what an asynchronous transport does.
class FakeTransport : public Transport {
 public:
  const char* name() const override { return "fake"; }
  Result<std::shared_ptr<Destination>> resolve(schema::CacheDest::Reader) override {
    return std::shared_ptr<Destination>(dest);
  }
  Status check_connect(schema::ConnectTask::Reader) override { return {}; }
  void poll(std::vector<TransferCompletion>& out) override {
    out.insert(out.end(), ready.begin(), ready.end());
    ready.clear();
  }
  bool has_completions() const override { return !ready.empty(); }
  // Completes the held transfers `which` selects (all by default), with the
  // status `outcome` gives each.
  void release(const std::function<bool(const TransferTicket&)>& which = nullptr,
               const std::function<Status(const TransferTicket&)>& outcome = nullptr) {
    std::deque<TransferCompletion> keep;
    for (TransferCompletion& c : held) {
      if (which && !which(c.ticket)) {
        keep.push_back(c);
        continue;
      }
      if (outcome) c.status = outcome(c.ticket);
      ready.push_back(c);
    }
    held = std::move(keep);
  }
  bool deferred = false;
  std::deque<TransferCompletion> held;
  std::vector<TransferCompletion> ready;
  std::shared_ptr<RecordingDestination> dest =
      std::make_shared<RecordingDestination>([this](TransferCompletion c) {
        if (deferred) {
          held.push_back(std::move(c));
        } else {
          ready.push_back(std::move(c));
        }
      });
};

struct Report {
  uint64_t handle;
  ReportKind kind;
  std::string message;
};

class SchedulerTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kLayers = 3;
  static constexpr uint32_t kBlockTokens = 16;
  PoolGeometry geometry() {
    PoolGeometry g;
    g.num_layers = kLayers;
    g.num_blocks = 1024;
    g.kv_heads = 1;
    g.block_size = kBlockTokens;
    g.head_dim = 8;
    return g;
  }
  FakeTransport transport;
  std::vector<Report> reports;
  SendScheduler s{0, geometry(), transport,
                  [this](uint64_t h, ReportKind k, uint64_t, const std::string& m, uint64_t) {
                    reports.push_back({h, k, m});
                  }};

  // `watermark`: the signal-ring position when the task was submitted
  // (nullopt: a task that carries none).
  void bind(uint64_t h, std::vector<uint32_t> src, uint64_t tokens, uint32_t slot,
            std::optional<uint64_t> watermark = std::nullopt) {
    capnp::MallocMessageBuilder m;
    auto t = m.initRoot<schema::CacheTask>();
    t.setRequestId("r" + std::to_string(h));
    auto l = t.initSrcBlockIds(static_cast<unsigned>(src.size()));
    for (unsigned i = 0; i < src.size(); ++i)
      l.set(i, src[i]);
    t.setNeedPrefillTokens(tokens);
    t.setEngineSlot(slot);
    s.on_bind(h, t.asReader(), watermark);
  }
  void dest(uint64_t h, std::vector<uint32_t> dst) {
    capnp::MallocMessageBuilder m;
    auto d = m.initRoot<schema::CacheDest>();
    auto l = d.initDestBlockIds(static_cast<unsigned>(dst.size()));
    for (unsigned i = 0; i < dst.size(); ++i)
      l.set(i, dst[i]);
    s.on_dest(h, d.asReader());
  }
  void batch(uint64_t step, std::vector<records::BatchEntry> entries, uint32_t session = 0) {
    LayerSignal sig{};
    sig.kind = static_cast<uint32_t>(SignalKind::kBatch);
    sig.step = step;
    sig.session = session;
    sig.count = static_cast<uint32_t>(entries.size());
    for (size_t i = 0; i < entries.size(); ++i)
      sig.entries[i] = entries[i];
    s.on_signal(sig, pushed++);
  }
  void layer(uint64_t step, uint32_t l) {
    LayerSignal sig{};
    sig.kind = static_cast<uint32_t>(SignalKind::kLayerDone);
    sig.step = step;
    sig.layer = l;
    s.on_signal(sig, pushed++);
  }
  uint64_t pushed = 0;  // signals pushed so far: the ring position of the next one
  void all_layers(uint64_t step) {
    for (uint32_t l = 0; l < kLayers; ++l)
      layer(step, l);
  }
  bool written(uint32_t l, uint32_t block) {
    return transport.dest->written.count({l, block}) != 0;
  }
};

TEST_F(SchedulerTest, EachLayerMovesWhenSignalled) {
  bind(1, {10, 11, 12}, 48, 0);
  dest(1, {20, 21, 22});
  batch(1, {{0, 0, 48}});
  layer(1, 0);
  EXPECT_TRUE(written(0, 20) && written(0, 22));
  EXPECT_FALSE(written(1, 20)) << "layer 1 is not computed yet";
  layer(1, 1);
  layer(1, 2);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].kind, ReportKind::kFinished);
  EXPECT_EQ(s.transfers_in_flight(), 0u);
}

TEST_F(SchedulerTest, ChunkEndsExcludeThePartialBlockUntilTheLastChunk) {
  bind(1, {10, 11, 12}, 40, 0);  // 40 tokens: blocks 0,1 full, block 2 partial
  dest(1, {20, 21, 22});
  batch(1, {{0, 0, 24}});  // 24 tokens: only block 0 is complete
  all_layers(1);
  EXPECT_TRUE(written(0, 20));
  EXPECT_FALSE(written(0, 21));
  batch(2, {{0, 24, 16}});  // the last chunk: everything
  all_layers(2);
  EXPECT_TRUE(written(2, 21) && written(2, 22));
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].kind, ReportKind::kFinished);
}

TEST_F(SchedulerTest, PrefixHeldByTheDecodeSideIsNeverSent) {
  bind(1, {10, 11, 12, 13}, 64, 0);
  dest(1, {30});  // decode already holds blocks 0..2
  batch(1, {{0, 0, 64}});
  all_layers(1);
  EXPECT_EQ(transport.dest->written.size(), size_t{kLayers});
  for (uint32_t l = 0; l < kLayers; ++l)
    EXPECT_TRUE(written(l, 30));
  EXPECT_EQ(reports.at(0).kind, ReportKind::kFinished);
}

TEST_F(SchedulerTest, FullyPrefixCachedRequestSendsNothingAndFinishesAfterPrefill) {
  bind(1, {10, 11}, 32, 0);
  dest(1, {});
  EXPECT_TRUE(reports.empty());
  batch(1, {{0, 0, 32}});
  all_layers(1);
  EXPECT_TRUE(transport.dest->written.empty());
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].kind, ReportKind::kFinished);
}

TEST_F(SchedulerTest, SignalsBeforeTheTaskAreBufferedAndAdopted) {
  batch(1, {{5, 0, 32}});
  all_layers(1);  // the whole prefill happened before either half
  bind(1, {10, 11}, 32, 5);
  dest(1, {20, 21});
  EXPECT_TRUE(written(kLayers - 1, 21));
  EXPECT_EQ(reports.at(0).kind, ReportKind::kFinished);
}

TEST_F(SchedulerTest, LateDestinationCatchesUpOnEverythingPrefilled) {
  bind(1, {10, 11, 12}, 48, 0);
  batch(1, {{0, 0, 32}});
  all_layers(1);
  batch(2, {{0, 32, 16}});
  layer(2, 0);
  dest(1, {20, 21, 22});  // blocks 0-1 of every layer, block 2 of layer 0
  EXPECT_TRUE(written(2, 21));
  EXPECT_TRUE(written(0, 22));
  EXPECT_FALSE(written(1, 22));
  layer(2, 1);
  layer(2, 2);
  EXPECT_EQ(reports.at(0).kind, ReportKind::kFinished);
}

TEST_F(SchedulerTest, SlotReusedAfterPrefillCompletesDoesNotDisturbThePreviousRequest) {
  bind(1, {10, 11}, 20, 0);
  batch(1, {{0, 0, 20}});
  all_layers(1);  // request 1's prefill is complete; its decode half is late
  bind(2, {40, 41}, 32, 0);
  batch(2, {{0, 0, 32}});
  all_layers(2);
  dest(2, {60, 61});
  dest(1, {50, 51});
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].kind, ReportKind::kFinished);
  EXPECT_EQ(reports[1].kind, ReportKind::kFinished);
  EXPECT_TRUE(written(0, 50) && written(0, 61));
}

TEST_F(SchedulerTest, SlotGivenAwayBeforePrefillCompletedFailsThePreviousRequest) {
  bind(1, {10, 11}, 32, 0);
  batch(1, {{0, 0, 16}});
  all_layers(1);
  bind(2, {40}, 16, 0);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].handle, 1u);
  EXPECT_EQ(reports[0].kind, ReportKind::kFailed);
}

// The bind of a request reaches the worker through the coordinator and can
// be overtaken by signals: here both requests of slot 0 have prefilled before
// either is bound. Tags keep them apart.
TEST_F(SchedulerTest, TaggedSignalsForTwoRequestsOfOneSlotBeforeEitherIsBound) {
  const uint32_t a = records::request_tag("r1");
  const uint32_t b = records::request_tag("r2");
  batch(1, {{0, 0, 32, a}});
  all_layers(1);  // request r1: complete
  batch(2, {{0, 0, 16, b}});
  all_layers(2);  // request r2, first chunk
  bind(1, {10, 11}, 32, 0);
  dest(1, {20, 21});
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].kind, ReportKind::kFinished);
  bind(2, {40, 41}, 32, 0);
  dest(2, {60, 61});
  EXPECT_TRUE(written(2, 60));
  EXPECT_FALSE(written(0, 61)) << "r2's second block is not computed yet";
  batch(3, {{0, 16, 16, b}});
  all_layers(3);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[1].kind, ReportKind::kFinished);
  EXPECT_TRUE(written(2, 61));
}

TEST_F(SchedulerTest, TaggedSlotMovingOnBeforePrefillCompletedFailsTheBoundRequest) {
  bind(1, {10, 11}, 32, 0);
  batch(1, {{0, 0, 16, records::request_tag("r1")}});
  all_layers(1);
  batch(2, {{0, 0, 16, records::request_tag("someone-else")}});
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].kind, ReportKind::kFailed);
  EXPECT_EQ(reports[0].message,
            "engine slot 0 moved on to another request before this request's prefill completed");
}

// A TP engine's scheduler (one process) submits the next request of a slot
// while another rank's model runner (another process) has not yet pushed the
// last layer of the previous request's final chunk: the bind overtakes that
// rank's last signal. With tagged batches the previous request still gets
// its last layer by its tag and finishes; only a batch of this rank that
// gives the slot away before its prefill completed fails it. (The example
// engine hit this on the real processes: "engine slot 0 was given to request
// 'req-7-4' before this request's prefill completed".)
TEST_F(SchedulerTest, ATaggedBindOvertakingAnotherRanksLastLayerLeavesThePreviousRequestItsLayer) {
  const uint32_t a = records::request_tag("r1");
  const uint32_t b = records::request_tag("r2");
  bind(1, {10, 11}, 32, 0);
  dest(1, {50, 51});
  batch(1, {{0, 0, 32, a}});
  for (uint32_t l = 0; l + 1 < kLayers; ++l) layer(1, l);  // this rank: not the last layer yet
  bind(2, {40}, 16, 0);  // the scheduler moved slot 0 on
  EXPECT_TRUE(reports.empty()) << "r1 failed: " << (reports.empty() ? "" : reports[0].message);
  layer(1, kLayers - 1);  // the last layer of r1, pushed after r2's submission
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].handle, 1u);
  EXPECT_EQ(reports[0].kind, ReportKind::kFinished) << reports[0].message;
  EXPECT_TRUE(written(kLayers - 1, 51));
  dest(2, {60});
  batch(2, {{0, 0, 16, b}});
  all_layers(2);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[1].kind, ReportKind::kFinished) << reports[1].message;
}

TEST_F(SchedulerTest, ConsecutiveIdsCoalesceIntoOneCopyPerLayer) {
  bind(1, {10, 11, 12, 13}, 64, 0);
  dest(1, {20, 21, 22, 23});
  batch(1, {{0, 0, 64}});
  all_layers(1);
  EXPECT_EQ(transport.dest->copies, static_cast<int>(kLayers));
}

TEST_F(SchedulerTest, OutOfRangeSourceBlockFailsTheRequestWithTheLimit) {
  bind(1, {10, 5000}, 32, 0);
  dest(1, {20, 21});
  batch(1, {{0, 0, 32}});
  layer(1, 0);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].kind, ReportKind::kFailed);
  EXPECT_EQ(reports[0].message,
            "source block id 5000 out of range: pool has 1024 blocks (rank 0, layer 0)");
}

TEST_F(SchedulerTest, LegacyModeSendsLayersAsTheStepAndLayerPassThem) {
  capnp::MallocMessageBuilder m;
  auto t = m.initRoot<schema::CacheTask>();
  t.setRequestId("legacy");
  auto l = t.initSrcBlockIds(2);
  l.set(0, 1);
  l.set(1, 2);
  t.setNeedPrefillTokens(20);
  t.setLegacyPrefillStep(7);
  s.on_bind(9, t.asReader());
  dest(9, {3, 4});
  LayerSignal sig{};
  sig.kind = static_cast<uint32_t>(SignalKind::kLegacyLayerDone);
  sig.step = 6;
  sig.layer = 2;
  s.on_signal(sig);
  EXPECT_TRUE(transport.dest->written.empty()) << "step 6 is before the request's step";
  sig.step = 7;
  sig.layer = 1;
  s.on_signal(sig);
  EXPECT_TRUE(written(1, 4));
  EXPECT_FALSE(written(2, 4));
  sig.step = 8;
  sig.layer = 0;
  s.on_signal(sig);  // a later step: every layer of step 7 is done
  EXPECT_TRUE(written(2, 4));
  EXPECT_EQ(reports.at(0).kind, ReportKind::kFinished);
}

TEST_F(SchedulerTest, CancelReportsAndForgetsTheRequest) {
  bind(1, {10}, 16, 0);
  s.on_cancel(1);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].kind, ReportKind::kCancelled);
  EXPECT_EQ(s.live_requests(), 0u);
  s.on_cancel(77);  // unknown: still answered, so the coordinator can settle
  EXPECT_EQ(reports.back().kind, ReportKind::kCancelled);
}

// The input that found it (block size 16 here): request A
// (slot 5, two blocks) is withdrawn before the engine learns so, and the
// engine pushes A's chunk, untagged, at step 7. Then B takes slot 5 and
// prefills in two chunks at steps 8 and 9. B must adopt nothing of A's: its
// blocks go only as B computes them, and hold B's bytes.
class LeftoverSignals : public SchedulerTest, public ::testing::WithParamInterface<bool> {};

TEST_P(LeftoverSignals, AnEndedRequestsUntaggedSignalsAreNeverAdoptedByTheNextOnItsSlot) {
  const bool b_tagged = GetParam();
  const uint32_t b_tag = b_tagged ? records::request_tag("r2") : 0;
  bind(1, {10, 11}, 32, 5, pushed);  // A
  s.on_cancel(1);                    // withdrawn (refused by the decode side, say)
  batch(7, {{5, 0, 32, 0}});         // A's chunk, the engine not knowing yet
  all_layers(7);
  bind(2, {12, 13, 14}, 48, 5, pushed);  // B, submitted after A's signals
  dest(2, {22, 23, 24});
  EXPECT_TRUE(transport.dest->written.empty()) << "B has computed nothing yet";
  batch(8, {{5, 0, 16, b_tag}});
  all_layers(8);
  EXPECT_TRUE(written(0, 22));
  EXPECT_FALSE(written(0, 23)) << "B's second block is not computed yet";
  batch(9, {{5, 16, 32, b_tag}});
  all_layers(9);
  EXPECT_TRUE(written(kLayers - 1, 23));
  EXPECT_TRUE(written(kLayers - 1, 24));
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].kind, ReportKind::kCancelled);
  EXPECT_EQ(reports[1].handle, 2u);
  EXPECT_EQ(reports[1].kind, ReportKind::kFinished) << reports[1].message;
  EXPECT_EQ(s.counters().stale_sessions, 1u) << "A's leftover was dropped as stale";
}

INSTANTIATE_TEST_SUITE_P(BTagged, LeftoverSignals, ::testing::Bool(),
                         [](const auto& tagged) { return tagged.param ? "Tagged" : "Untagged"; });

// Untagged signals pushed after the task was submitted, but read before its
// bind arrived (the bind travels through the coordinator), are its own.
TEST_F(SchedulerTest, UntaggedSignalsAfterTheSubmissionButBeforeTheBindAreAdopted) {
  const uint64_t submitted_at = pushed;
  batch(1, {{5, 0, 32, 0}});
  all_layers(1);
  bind(1, {10, 11}, 32, 5, submitted_at);
  dest(1, {20, 21});
  EXPECT_TRUE(written(kLayers - 1, 21));
  EXPECT_EQ(reports.at(0).kind, ReportKind::kFinished);
}

// The shape of a lost final chunk, at the scheduler: A is bound on slot 5 and withdrawn;
// its chunk, pushed as the engine aborted it, arrives after the withdrawal
// and becomes a leftover untagged session. B then takes slot 5 with a cached
// prefix: its only chunk is its final one, at an offset, and is read before
// B's bind (which travels through the coordinator). Untagged, that chunk
// continues A's leftover session, which began before B's watermark: B must
// fail at once naming the slot and the step, not wait for its deadline.
// Tagged (as a kvrelay client stamps an untagged entry with the request its
// slot was last given), B adopts it and finishes.
class FinalChunkAfterALeftover : public SchedulerTest,
                                 public ::testing::WithParamInterface<bool> {};

TEST_P(FinalChunkAfterALeftover, IsAdoptedWhenStampedAndFailsNamingSlotAndStepWhenNot) {
  const bool stamped = GetParam();
  bind(1, {10, 11}, 32, 5, pushed);  // A
  s.on_cancel(1);
  batch(7, {{5, 0, 16, stamped ? records::request_tag("r1") : 0}});  // A's first chunk, too late
  all_layers(7);
  const uint64_t b_submitted = pushed;
  // B: 40 tokens in three blocks, the first two cached on the prefill side.
  batch(8, {{5, 32, 8, stamped ? records::request_tag("r2") : 0}});
  all_layers(8);
  bind(2, {12, 13, 14}, 40, 5, b_submitted);
  if (s.live_requests() != 0) dest(2, {22, 23, 24});
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[1].handle, 2u);
  if (stamped) {
    EXPECT_EQ(reports[1].kind, ReportKind::kFinished) << reports[1].message;
    EXPECT_TRUE(written(kLayers - 1, 24));
  } else {
    EXPECT_EQ(reports[1].kind, ReportKind::kFailed);
    EXPECT_NE(reports[1].message.find("engine slot 5, step 8"), std::string::npos)
        << reports[1].message;
    EXPECT_TRUE(transport.dest->written.empty()) << "nothing of A's leftover is sent for B";
  }
  EXPECT_EQ(s.live_requests(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Entries, FinalChunkAfterALeftover, ::testing::Bool(),
                         [](const auto& p) { return p.param ? "Stamped" : "Untagged"; });

// The watchdog's view: a request is listed only once it has gone
// `after` without reporting since its final chunk was signalled here (or
// since it ended with transfers in flight), with what it waits for, and
// listed as new only the first time.
TEST_F(SchedulerTest, FindStallsListsRequestsLongAfterTheirFinalChunkWithWhatTheyWaitFor) {
  transport.deferred = true;
  bind(1, {10}, 16, 0);  // final chunk signalled, no decode half yet
  bind(2, {11}, 16, 1);  // final chunk signalled, its transfers held by the transport
  dest(2, {21});
  bind(3, {12}, 32, 2);  // only a first chunk: its final chunk was never signalled
  dest(3, {22});
  bind(4, {13}, 16, 3);  // cancelled with a transfer in flight
  dest(4, {23});
  batch(1, {{0, 0, 16}, {1, 0, 16}, {2, 0, 16}, {3, 0, 16}});
  all_layers(1);
  s.on_cancel(4);
  std::vector<SendScheduler::Stall> stalls;
  const uint64_t now = mono_now_ns();
  s.find_stalls(now, ns_of(std::chrono::seconds(10)), stalls);
  EXPECT_TRUE(stalls.empty()) << "nothing is stalled before the bound";
  s.find_stalls(now + ns_of(std::chrono::seconds(11)), ns_of(std::chrono::seconds(10)), stalls);
  ASSERT_EQ(stalls.size(), 3u);
  std::map<std::string, SendScheduler::Stall> by_id;
  for (const auto& st : stalls) {
    EXPECT_TRUE(st.first_time);
    by_id.emplace(*st.id, st);
  }
  EXPECT_EQ(by_id.at("r1").reason, StallReason::kNoDecodeHalf);
  EXPECT_EQ(by_id.at("r2").reason, StallReason::kTransfersInFlight);
  EXPECT_EQ(by_id.at("r2").in_flight, kLayers);
  EXPECT_EQ(*by_id.at("r2").peer, "the fake peer");
  EXPECT_EQ(by_id.at("r4").reason, StallReason::kWithdrawing);
  EXPECT_EQ(by_id.count("r3"), 0u) << "its final chunk was never signalled";
  s.find_stalls(now + ns_of(std::chrono::seconds(12)), ns_of(std::chrono::seconds(10)), stalls);
  ASSERT_EQ(stalls.size(), 3u);
  for (const auto& st : stalls)
    EXPECT_FALSE(st.first_time);
  transport.release();
  s.poll_transfers();
  s.find_stalls(now + ns_of(std::chrono::seconds(13)), ns_of(std::chrono::seconds(10)), stalls);
  ASSERT_EQ(stalls.size(), 1u) << "r2 finished and r4 reported once their transfers completed";
  EXPECT_EQ(*stalls[0].id, "r1");
}

// A step number used again does not merge two batches: A finished its
// prefill at step 7, then B on the same slot ran both chunks at step 7 too.
TEST_F(SchedulerTest, ARepeatedStepNumberStartsANewBatch) {
  bind(1, {10, 11}, 32, 5, pushed);  // A, untagged
  dest(1, {20, 21});
  batch(7, {{5, 0, 32, 0}});
  all_layers(7);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].kind, ReportKind::kFinished);
  bind(2, {12, 13, 14}, 48, 5, pushed);  // B
  dest(2, {22, 23, 24});
  batch(7, {{5, 0, 16, 0}});
  all_layers(7);
  EXPECT_TRUE(written(0, 22));
  EXPECT_FALSE(written(0, 23)) << "A's 32 tokens of step 7 must not count for B";
  batch(7, {{5, 16, 32, 0}});
  all_layers(7);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[1].kind, ReportKind::kFinished) << reports[1].message;
  EXPECT_TRUE(written(kLayers - 1, 24));
}

// A restarted engine reusing request ids (and so tags) must not inherit the
// signals its dead predecessor pushed for requests never bound.
TEST_F(SchedulerTest, SignalsOfAnEngineSessionThatDiedAreForgotten) {
  const uint32_t tag = records::request_tag("r1");
  const uint32_t dead = records::session_id(3, 7);
  batch(1, {{0, 0, 32, tag}}, dead);
  all_layers(1);
  s.on_session_ended(dead);
  EXPECT_EQ(s.counters().stale_sessions, 1u);
  bind(1, {10, 11}, 32, 0);
  dest(1, {20, 21});
  EXPECT_TRUE(transport.dest->written.empty()) << "nothing of the dead engine's signals is used";
  batch(2, {{0, 0, 32, tag}}, records::session_id(4, 1));
  all_layers(2);
  EXPECT_EQ(reports.at(0).kind, ReportKind::kFinished);
}

// The data plane is asynchronous: a transfer's completion, not its
// submission, is what lets a request finish.
TEST_F(SchedulerTest, ARequestFinishesOnlyWhenEveryLayerIsAppliedAtTheDestination) {
  transport.deferred = true;
  bind(1, {10, 11, 12}, 48, 0);
  dest(1, {20, 21, 22});
  batch(1, {{0, 0, 48}});
  all_layers(1);
  EXPECT_TRUE(reports.empty()) << "every layer is submitted, none applied";
  EXPECT_EQ(s.transfers_in_flight(), 3u);
  transport.release([](const TransferTicket& t) { return t.layer < 2; });
  s.poll_transfers();
  EXPECT_TRUE(reports.empty()) << "layer 2 is still in flight";
  EXPECT_EQ(s.transfers_in_flight(), 1u);
  transport.release();
  s.poll_transfers();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].kind, ReportKind::kFinished);
  EXPECT_EQ(s.counters().bytes, 3u * 3u * 100u) << "the bytes of the completions, once each";
  s.poll_transfers();
  EXPECT_EQ(reports.size(), 1u);
}

TEST_F(SchedulerTest, AFailedTransferFailsOnlyItsRequestNamingTheLayerAndThePeer) {
  transport.deferred = true;
  bind(1, {10, 11}, 32, 0);
  bind(2, {12, 13}, 32, 1);
  dest(1, {20, 21});
  dest(2, {22, 23});
  batch(1, {{0, 0, 32}, {1, 0, 32}});
  all_layers(1);
  transport.release(nullptr, [](const TransferTicket& t) -> Status {
    if (t.handle == 1 && t.layer == 1) return make_error(Errc::kSystem, "connection reset");
    return {};
  });
  s.poll_transfers();
  ASSERT_EQ(reports.size(), 2u);
  std::map<uint64_t, Report> by_handle;
  for (const Report& r : reports)
    by_handle[r.handle] = r;
  EXPECT_EQ(by_handle[1].kind, ReportKind::kFailed);
  EXPECT_EQ(by_handle[1].message, "connection reset (layer 1, to the fake peer)");
  EXPECT_EQ(by_handle[2].kind, ReportKind::kFinished) << "the other request is unaffected";
  EXPECT_EQ(s.live_requests(), 0u);
}

// A request must not be reported while a transfer may still write its
// destination blocks: the decode side would reuse them under the write.
TEST_F(SchedulerTest, ACancelWithTransfersInFlightIsReportedOnlyWhenTheyHaveCompleted) {
  transport.deferred = true;
  bind(1, {10, 11}, 32, 0);
  dest(1, {20, 21});
  batch(1, {{0, 0, 32}});
  layer(1, 0);
  s.on_cancel(1);
  EXPECT_TRUE(reports.empty());
  EXPECT_EQ(s.live_requests(), 1u);
  s.on_cancel(1);  // a second cancel changes nothing
  layer(1, 1);     // nor does a later signal: nothing more is submitted
  EXPECT_EQ(transport.dest->copies, 1);
  transport.release();
  s.poll_transfers();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].kind, ReportKind::kCancelled);
  EXPECT_EQ(s.live_requests(), 0u);
}

TEST_F(SchedulerTest, ARefusedSubmissionFailsTheRequestAndSubmitsNothingAfterIt) {
  transport.dest->refuse_layer = 1;
  bind(1, {10, 11}, 32, 0);
  dest(1, {20, 21});
  batch(1, {{0, 0, 32}});
  all_layers(1);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].kind, ReportKind::kFailed);
  EXPECT_EQ(reports[0].message, "refused by the test (layer 1, to the fake peer)");
  EXPECT_FALSE(written(2, 20)) << "nothing is submitted after the refusal";
}

// A completion of a request that has ended and whose handle was bound again
// belongs to the old binding: it neither counts for nor ends the new one.
TEST_F(SchedulerTest, ACompletionOfAnEarlierBindingOfTheHandleIsIgnored) {
  transport.deferred = true;
  bind(1, {10}, 16, 0);
  dest(1, {20});
  batch(1, {{0, 0, 16}});
  layer(1, 0);
  const TransferCompletion old = transport.held.front();
  transport.release();
  s.poll_transfers();
  s.on_cancel(1);
  ASSERT_EQ(reports.size(), 1u) << "cancelled";
  bind(1, {11}, 16, 1);
  dest(1, {21});
  transport.ready.push_back(old);  // the old binding's completion, again
  s.poll_transfers();
  EXPECT_EQ(reports.size(), 1u);
  EXPECT_EQ(s.live_requests(), 1u);
}

}  // namespace
}  // namespace kvrelay::worker
