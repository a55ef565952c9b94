// Expected requests (ExpectArrival) between real processes, over ipc (one
// host: the prefill worker writes the decode pool itself and checks the
// decode rank's claims first) and over tcp (two hosts): the decode engine
// learns that its KV arrived exactly once, an expected request that never
// comes times out and its late writes are refused, a cancel is answered once
// and refuses what comes after it, nobody writes into blocks another request
// declared, and a declared request written outside its blocks fails on both
// sides. Every test checks exactly one completion per request on each side
// and that nothing outside the requests' destination blocks changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>

#include "instance/control_segment.h"
#include "integration/dump_json.h"
#include "integration/request_driver.h"
#include "integration/tcp_hosts.h"
#include "shm/claim_table.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

InstanceArgs args() {
  return RequestDriver::small_pair();
}

// A declaration from any sender, named by its id alone (the scoped and
// nonce'd kind: AWriteFromAnotherInstanceIsRefusedAndFailsNothing).
ExpectSpec expect(std::string id, std::vector<uint32_t> blocks, uint32_t deadline_ms) {
  ExpectSpec e;
  e.request_id = std::move(id);
  e.dest_block_ids = std::move(blocks);
  e.deadline_ms = deadline_ms;
  return e;
}

class ExpectedArrivals : public ::testing::TestWithParam<Protocol> {
 protected:
  void SetUp() override {
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    const std::string tag = GetParam() == Protocol::kTcp ? "xtcp" : "xipc";
    if (GetParam() == Protocol::kTcp) {
      hosts = std::make_unique<TcpHosts>(tag, 2);
      env = std::make_unique<TwoInstances>(tag, args(), hosts->placement());
      env->set_route(hosts->route());
    } else {
      env = std::make_unique<TwoInstances>(tag, args());
    }
    driver = std::make_unique<RequestDriver>(*env, RequestDriver::kLayers, RequestDriver::kBlockTokens);
  }
  void TearDown() override {
    driver.reset();
    if (env) env->stop_and_check_clean();
  }

  Client& decode_engine() { return env->decode().client(); }
  // The decode engine's next completion, or none within `within`.
  std::optional<Completion> decode_completion(std::chrono::milliseconds within = 10s) {
    Result<Completion> c = decode_engine().wait(Deadline::after(within));
    if (!c) return std::nullopt;
    return *c;
  }
  uint64_t request_bytes(const sim::RequestBlocks& r) {
    const uint64_t block = env->dst_pool(0).geometry().block_bytes(PoolTensor::kKey);
    return r.dst.size() * RequestDriver::kLayers * 2 * block * env->tp();
  }
  // Waits until every decode rank has taken the declaration of `blocks`
  // (its claims are visible in the rank's claim table): the rule that
  // nobody else writes into them holds from then on. Nothing tells an
  // engine when that is; these tests need the order exact.
  void wait_until_declared(const std::vector<uint32_t>& blocks) {
    Result<ControlSegment> c = ControlSegment::attach(
        env->decode().name(), AttachOptions{.access = SegmentAccess::kReadOnly});
    ASSERT_TRUE(c) << c.error().message;
    const uint32_t n = claim_table_blocks(c->config());
    const Deadline until = Deadline::after(5s);
    for (uint32_t rank = 0; rank < env->tp(); ++rank) {
      const ClaimWriterView claims(c->claim_table(rank), n, 0);  // only read
      while (!std::all_of(blocks.begin(), blocks.end(),
                          [&](uint32_t b) { return claims.claim_of(b) != 0; })) {
        ASSERT_FALSE(until.passed()) << "rank " << rank << " never took the declaration";
        std::this_thread::sleep_for(1ms);
      }
    }
  }
  bool poisoned(const sim::RequestBlocks& r) {
    for (uint32_t rank = 0; rank < env->tp(); ++rank)
      for (uint32_t l = 0; l < RequestDriver::kLayers; ++l)
        for (uint32_t b : r.dst)
          if (!sim::block_is_poisoned(env->dst_pool(rank), l, 0, b)) return false;
    return true;
  }

  std::unique_ptr<TcpHosts> hosts;
  std::unique_ptr<TwoInstances> env;
  std::unique_ptr<RequestDriver> driver;
};

TEST_P(ExpectedArrivals, TheDecodeEngineLearnsItsKvArrivedExactlyOnce) {
  sim::RequestBlocks r = driver->blocks(4);
  Status s = decode_engine().submit(expect("arrive", r.dst, 20'000), Deadline::after(5s));
  ASSERT_TRUE(s) << s.error().message;
  driver->submit("arrive", r, 0);
  driver->layers_done(0, RequestDriver::kLayers);
  const Completion sent = env->wait_for("arrive");
  EXPECT_EQ(sent.status, CompletionStatus::kFinished) << sent.message;
  std::optional<Completion> here = decode_completion();
  ASSERT_TRUE(here) << "no arrived completion";
  EXPECT_EQ(here->request_id, "arrive");
  EXPECT_EQ(here->kind, CompletionKind::kArrived);
  EXPECT_EQ(here->status, CompletionStatus::kFinished) << here->message;
  EXPECT_EQ(here->bytes_moved, request_bytes(r));
  EXPECT_EQ(env->wrong_words(r), 0u);
  EXPECT_FALSE(decode_completion(300ms)) << "exactly one completion";
  EXPECT_EQ(driver->stray_writes({r}), 0u);
}

// The decode side's tail is timed hop by hop (docs/latency.md) where the
// writer shares the host's clock: over ipc each decode rank times every
// landed record's read and its arrived report after the last one; tcp's
// frames carry no stamp from another host's clock, and nothing is timed.
TEST_P(ExpectedArrivals, TheDecodeSidesTailIsTimedWhereTheWriterSharesTheClock) {
  sim::RequestBlocks r = driver->blocks(4);
  Status s = decode_engine().submit(expect("timed", r.dst, 20'000), Deadline::after(5s));
  ASSERT_TRUE(s) << s.error().message;
  driver->submit("timed", r, 0);
  driver->layers_done(0, RequestDriver::kLayers);
  EXPECT_EQ(env->wait_for("timed").status, CompletionStatus::kFinished);
  std::optional<Completion> here = decode_completion();
  ASSERT_TRUE(here) << "no arrived completion";
  ASSERT_EQ(here->status, CompletionStatus::kFinished) << here->message;
  const nlohmann::json j = dump_json(env->decode().name());
  ASSERT_TRUE(j.is_object());
  const bool ipc = GetParam() == Protocol::kIpc;
  ASSERT_EQ(j["workers"].size(), env->tp());
  for (const auto& w : j["workers"]) {
    const auto& h = w["histograms"];
    EXPECT_EQ(h["tail_last_landed_to_report"]["count"], ipc ? 1 : 0) << w.dump();
    if (ipc)
      EXPECT_GE(h["hop_landed_to_read"]["count"].get<uint64_t>(), RequestDriver::kLayers)
          << "a record per layer at least";
    else
      EXPECT_EQ(h["hop_landed_to_read"]["count"], 0);
  }
  EXPECT_EQ(j["coordinator"]["histograms"]["tail_last_report_written_to_read"]["count"], 1)
      << "the arrived report that completed it";
}

TEST_P(ExpectedArrivals, ManyExpectedRequestsEachArriveOnceWithTheirOwnBytes) {
  std::vector<sim::RequestBlocks> all;
  for (int i = 0; i < 6; ++i) {
    all.push_back(driver->blocks(1 + i % 3));
    ASSERT_TRUE(decode_engine().submit(expect("many-" + std::to_string(i), all.back().dst, 20'000),
                                       Deadline::after(5s)));
  }
  for (int i = 0; i < 6; ++i) {
    driver->submit("many-" + std::to_string(i), all[i], 0);
    driver->layers_done(0, RequestDriver::kLayers);
    EXPECT_EQ(env->wait_for("many-" + std::to_string(i)).status, CompletionStatus::kFinished);
  }
  std::map<std::string, int> seen;
  for (int i = 0; i < 6; ++i) {
    std::optional<Completion> c = decode_completion();
    ASSERT_TRUE(c) << "missing arrived completions after " << i;
    EXPECT_EQ(c->status, CompletionStatus::kFinished) << c->request_id << ": " << c->message;
    const int index = std::stoi(c->request_id.substr(5));
    EXPECT_EQ(c->bytes_moved, request_bytes(all[index])) << c->request_id;
    ++seen[c->request_id];
  }
  EXPECT_EQ(seen.size(), 6u) << "each request once";
  EXPECT_FALSE(decode_completion(300ms));
  EXPECT_EQ(driver->stray_writes(all), 0u);
}

TEST_P(ExpectedArrivals, AnExpectedRequestThatNeverComesTimesOutAndItsLateWritesAreRefused) {
  sim::RequestBlocks r = driver->blocks(2);
  const auto t0 = Clock::now();
  ASSERT_TRUE(decode_engine().submit(expect("never", r.dst, 500), Deadline::after(5s)));
  std::optional<Completion> here = decode_completion();
  ASSERT_TRUE(here);
  EXPECT_EQ(here->kind, CompletionKind::kArrived);
  EXPECT_EQ(here->status, CompletionStatus::kTimeout) << here->message;
  EXPECT_LT(Clock::now() - t0, 5s);
  driver->submit("never", r, 0);
  driver->layers_done(0, RequestDriver::kLayers);
  const Completion late = env->wait_for("never");
  EXPECT_EQ(late.status, CompletionStatus::kError);
  EXPECT_NE(late.message.find("withdrawn"), std::string::npos) << late.message;
  EXPECT_TRUE(poisoned(r)) << "the late writes landed";
  EXPECT_EQ(driver->stray_writes({}), 0u);
}

TEST_P(ExpectedArrivals, ACancelIsAnsweredOnceAndRefusesTheWritesThatFollow) {
  sim::RequestBlocks r = driver->blocks(3);
  ASSERT_TRUE(decode_engine().submit(expect("called-off", r.dst, 20'000), Deadline::after(5s)));
  ASSERT_TRUE(decode_engine().cancel("called-off", Deadline::after(5s)));
  std::optional<Completion> here = decode_completion();
  ASSERT_TRUE(here);
  EXPECT_EQ(here->request_id, "called-off");
  EXPECT_EQ(here->status, CompletionStatus::kCancelled) << here->message;
  EXPECT_FALSE(decode_completion(300ms)) << "exactly one completion";
  driver->submit("called-off", r, 0);
  driver->layers_done(0, RequestDriver::kLayers);
  EXPECT_EQ(env->wait_for("called-off").status, CompletionStatus::kError);
  EXPECT_TRUE(poisoned(r));
  EXPECT_TRUE(driver->a_new_request_goes_through("after-cancel-"));
}

TEST_P(ExpectedArrivals, WritesIntoBlocksAnotherRequestDeclaredAreRefusedAndThatRequestArrives) {
  sim::RequestBlocks owner = driver->blocks(3);
  sim::RequestBlocks intruder = driver->blocks(3);
  intruder.dst = owner.dst;  // a buggy engine sends another request into them
  ASSERT_TRUE(decode_engine().submit(expect("owner", owner.dst, 20'000), Deadline::after(5s)));
  wait_until_declared(owner.dst);
  driver->submit("intruder", intruder, 0);
  driver->layers_done(0, RequestDriver::kLayers);
  const Completion refused = env->wait_for("intruder");
  EXPECT_EQ(refused.status, CompletionStatus::kError);
  const std::string why = GetParam() == Protocol::kTcp ? "which request 'owner' declared"
                                                       : "is declared by another request";
  EXPECT_NE(refused.message.find(why), std::string::npos) << refused.message;
  EXPECT_TRUE(poisoned(owner)) << "nothing written";
  driver->submit("owner", owner, 1);
  driver->layers_done(0, RequestDriver::kLayers);
  EXPECT_EQ(env->wait_for("owner").status, CompletionStatus::kFinished);
  std::optional<Completion> here = decode_completion();
  ASSERT_TRUE(here);
  EXPECT_EQ(here->request_id, "owner");
  EXPECT_EQ(here->status, CompletionStatus::kFinished) << here->message;
  EXPECT_EQ(here->bytes_moved, request_bytes(owner));
  EXPECT_EQ(env->wrong_words(owner), 0u);
  EXPECT_FALSE(decode_completion(300ms));
}

TEST_P(ExpectedArrivals, ADeclaredRequestWrittenOutsideItsBlocksFailsOnBothSides) {
  sim::RequestBlocks r = driver->blocks(3);
  std::vector<uint32_t> declared = r.dst;
  declared.back() = driver->blocks(1).dst[0];  // the sender's last block is not among them
  ASSERT_TRUE(decode_engine().submit(expect("astray", declared, 20'000), Deadline::after(5s)));
  wait_until_declared(declared);
  driver->submit("astray", r, 0);
  driver->layers_done(0, RequestDriver::kLayers);
  const Completion sent = env->wait_for("astray");
  EXPECT_EQ(sent.status, CompletionStatus::kError);
  // The rank that saw the stray write says so; another rank may be quicker
  // to report that the decode side withdrew the request meanwhile.
  EXPECT_TRUE(sent.message.find("did not declare") != std::string::npos ||
              sent.message.find("withdrawn") != std::string::npos)
      << sent.message;
  std::optional<Completion> here = decode_completion();
  ASSERT_TRUE(here);
  EXPECT_EQ(here->request_id, "astray");
  EXPECT_EQ(here->status, CompletionStatus::kError) << here->message;
  EXPECT_NE(here->message.find("which it did not declare"), std::string::npos) << here->message;
  EXPECT_FALSE(decode_completion(300ms)) << "exactly one completion";
  for (uint32_t rank = 0; rank < env->tp(); ++rank)
    EXPECT_TRUE(sim::block_is_poisoned(env->dst_pool(rank), 0, 0, r.dst.back()));
}

// A declaration names its sender: the real prefill instance's writes are
// then another instance's. They fail nothing here and count for nothing; the
// request times out. Over tcp the receiver refuses them, and the sender
// learns why; over ipc (one host: the segment's permissions are the trust)
// the writer's claim is only checked when its writes are counted.
TEST_P(ExpectedArrivals, WritesFromAnInstanceOtherThanTheNamedSenderCountForNothing) {
  sim::RequestBlocks r = driver->blocks(2);
  ExpectSpec e = expect("scoped", r.dst, 1500);
  e.from_instance = "someone-else";
  ASSERT_TRUE(decode_engine().submit(e, Deadline::after(5s)));
  wait_until_declared(r.dst);
  driver->submit("scoped", r, 0);
  driver->layers_done(0, RequestDriver::kLayers);
  const Completion sent = env->wait_for("scoped");
  if (GetParam() == Protocol::kTcp) {
    EXPECT_EQ(sent.status, CompletionStatus::kError);
    EXPECT_NE(sent.message.find("request 'scoped' is expected from instance 'someone-else', not "
                                "from '" +
                                env->prefill().name() + "'"),
              std::string::npos)
        << sent.message;
    EXPECT_TRUE(poisoned(r)) << "nothing written";
  }
  std::optional<Completion> here = decode_completion();
  ASSERT_TRUE(here);
  EXPECT_EQ(here->request_id, "scoped");
  EXPECT_EQ(here->status, CompletionStatus::kTimeout) << here->message;
  EXPECT_FALSE(decode_completion(300ms)) << "exactly one completion";
}

// A destination block beyond the decode pool fails the request before its
// first byte: over tcp too, where the sender learns the pool only when it
// connects, nothing of the request's valid blocks is written.
TEST_P(ExpectedArrivals, ARequestNamingABlockThePoolLacksWritesNothingAnywhere) {
  sim::RequestBlocks r = driver->blocks(3);
  const uint32_t lacks = env->dst_pool(0).geometry().num_blocks;
  r.dst.back() = lacks;
  driver->submit("beyond", r, 0);
  driver->layers_done(0, RequestDriver::kLayers);
  const Completion sent = env->wait_for("beyond");
  EXPECT_EQ(sent.status, CompletionStatus::kError);
  EXPECT_NE(sent.message.find(std::to_string(lacks)), std::string::npos) << sent.message;
  sim::RequestBlocks valid = r;
  valid.dst.pop_back();
  EXPECT_TRUE(poisoned(valid)) << "the valid blocks were written: " << sent.message;
}

INSTANTIATE_TEST_SUITE_P(Over, ExpectedArrivals, ::testing::Values(Protocol::kIpc, Protocol::kTcp),
                         [](const ::testing::TestParamInfo<Protocol>& p) {
                           return std::string(p.param == Protocol::kTcp ? "tcp" : "ipc");
                         });

}  // namespace
}  // namespace kvrelay::testing
