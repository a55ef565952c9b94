// Faults and hostile input across real processes: workers and
// coordinators SIGKILLed, an engine killed in the middle of a submit, full
// rings, hostile records written straight into the submit ring, and other
// users. Nothing may hang, and every request gets exactly one completion.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <random>

#include "instance/control_segment.h"
#include "integration/dump_json.h"
#include "integration/two_instances.h"
#include "schemas/codec.h"
#include "schemas/message_builders.h"
#include "schemas/message_ring.h"
#include "schemas/records.h"
#include "shm/liveness.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

bool process_gone_within(uint32_t pid, std::chrono::milliseconds within) {
  const Deadline until = Deadline::after(within);
  while (!until.passed()) {
    if (!pid_exists(pid)) return true;
    std::this_thread::sleep_for(10ms);
  }
  return !pid_exists(pid);
}

class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    InstanceArgs a;
    a.tp = 2;
    a.layers = 4;
    a.blocks = 256;
    env_ = std::make_unique<TwoInstances>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), a);
  }
  void TearDown() override {
    if (env_) env_->stop_and_check_clean();
  }
  // A request through all four layers on both ranks.
  void run_request(const std::string& id, const sim::RequestBlocks& r, uint64_t step,
                   uint32_t slot) {
    env_->send_whole_request(id, r, step, slot, 4);
  }
  std::unique_ptr<TwoInstances> env_;
};

TEST_F(Faults,
       KilledWorkerFailsItsInFlightRequestsNamingTheRankAndTheRestartedWorkerServesTheNext) {
  // One request that finishes before the kill: its bytes must stay intact.
  sim::RequestBlocks before{1, {1, 2}, {1, 2}};
  run_request("before", before, 1, 0);
  ASSERT_EQ(env_->wait_for("before").status, CompletionStatus::kFinished);

  // Three requests in flight: both halves in, only two of four layers signalled.
  std::vector<sim::RequestBlocks> inflight;
  std::vector<BatchSlot> batch;
  for (uint32_t i = 0; i < 3; ++i) {
    sim::RequestBlocks r{10 + i, {10 + 2 * i, 11 + 2 * i}, {20 + 2 * i, 21 + 2 * i}};
    env_->fill(r);
    const std::string id = "inflight-" + std::to_string(i);
    ASSERT_TRUE(env_->submit_task(id, r, 32, i + 1).ok());
    ASSERT_TRUE(env_->submit_dest(id, r).ok());
    batch.push_back({i + 1, 0, 32, Client::request_tag(id)});
    inflight.push_back(r);
  }
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(env_->engine().push_batch(rank, 2, batch, Deadline::after(5s)).ok());
    for (uint32_t l = 0; l < 2; ++l)
      ASSERT_TRUE(env_->engine().push_layer_done(rank, 2, l, Deadline::after(5s)).ok());
  }
  // Kill only once rank 1 holds the requests (its 8 tasks: a bind and a dest
  // for each of the 4): killed earlier, the coordinator refuses them as
  // never started, which is right but another test.
  const Deadline dispatched_by = Deadline::after(10s);
  while (dump_json(env_->prefill().name())["workers"][1]["counters"]["tasks"].get<uint64_t>() < 8 &&
         !dispatched_by.passed())
    std::this_thread::sleep_for(1ms);
  const uint32_t victim = worker_pid(env_->prefill().name(), 1);
  ASSERT_NE(victim, 0u);
  const uint64_t killed_at = mono_now_ns();
  kill(static_cast<pid_t>(victim), SIGKILL);
  for (uint32_t i = 0; i < 3; ++i) {
    const Completion c = env_->wait_for("inflight-" + std::to_string(i), 10s);
    EXPECT_EQ(c.status, CompletionStatus::kError) << c.message;
    EXPECT_EQ(c.error_rank, 1);
    EXPECT_NE(c.message.find("rank 1 died (killed by SIGKILL)"), std::string::npos) << c.message;
  }
  RecordProperty("kill_to_last_error_completion_ms",
                 static_cast<int>((mono_now_ns() - killed_at) / 1'000'000));
  EXPECT_EQ(env_->wrong_words(before), 0u) << "a finished request's bytes were damaged";

  // The barrier was poisoned for the survivors; the supervisor restarts rank 1.
  const Deadline until = Deadline::after(20s);
  while (!(env_->engine().rank_ready(1) && worker_pid(env_->prefill().name(), 1) != victim) &&
         !until.passed())
    std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(env_->engine().rank_ready(1)) << "rank 1 was not restarted";
  const auto j = dump_json(env_->prefill().name());
  EXPECT_GE(j["barrier"]["rounds_poisoned"].get<int>(), 1);
  EXPECT_EQ(j["coordinator"]["counters"]["worker_restarts"], 1);
  EXPECT_EQ(j["workers"][1]["registrations"], 2);

  sim::RequestBlocks after{50, {40, 41, 42}, {40, 41, 42}};
  run_request("after", after, 3, 0);
  const Completion c = env_->wait_for("after", 20s);
  EXPECT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  EXPECT_EQ(env_->wrong_words(after), 0u);
  EXPECT_EQ(env_->wrong_words(before), 0u);
}

TEST_F(Faults, FullSubmitRingPushesBackWithoutOverwritingAndEverythingArrivesLater) {
  kill(env_->prefill().pid(), SIGSTOP);
  uint32_t written = 0;
  Status s;
  for (;; ++written) {
    s = env_->engine().cancel("nobody-" + std::to_string(written), Deadline::now());
    if (!s) break;
  }
  EXPECT_EQ(s.code(), Errc::kFull) << s.error().message;
  EXPECT_GT(written, 1000u);
  const uint64_t t0 = mono_now_ns();
  Status blocked = env_->engine().cancel("one-more", Deadline::after(300ms));
  EXPECT_EQ(blocked.code(), Errc::kFull);
  EXPECT_GE(mono_now_ns() - t0, 300'000'000u)
      << "a blocking submit waits for room until its deadline";
  const auto j = dump_json(env_->prefill().name());
  EXPECT_GT(j["rings"][0]["full_events"].get<uint64_t>(), 0u) << "the full ring is counted";
  kill(env_->prefill().pid(), SIGCONT);
  std::set<std::string> ids;
  for (uint32_t i = 0; i < written; ++i) {
    auto c = env_->engine().wait(Deadline::after(20s));
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->status, CompletionStatus::kRejected);
    ids.insert(c->request_id);
  }
  EXPECT_EQ(ids.size(), written) << "each refused cancel answered once, none lost or duplicated";
  EXPECT_EQ(env_->engine().wait(Deadline::after(200ms)).code(), Errc::kTimeout);
}

TEST_F(Faults, EngineKilledInTheMiddleOfASubmitIsSkippedAndOtherProducersLoseNothing) {
  ReadyPipe claimed;
  const std::string instance = env_->prefill().name();
  const pid_t engine = fork_child([&] {
    auto c = ControlSegment::attach(instance);
    if (!c) return 2;
    auto producer = c->submit_ring()->lease_producer();
    if (!producer) return 3;
    auto claim = producer->claim_for_test(200);  // claimed, never committed
    if (!claim) return 4;
    claimed.signal();
    pause();
    return 0;
  });
  ASSERT_TRUE(claimed.wait(10s));
  kill_child(engine);
  std::vector<sim::RequestBlocks> reqs;
  for (uint32_t i = 0; i < 5; ++i) {
    sim::RequestBlocks r{70 + i, {60 + i}, {60 + i}};
    run_request("after-dead-engine-" + std::to_string(i), r, i + 1, i);
    reqs.push_back(r);
  }
  for (uint32_t i = 0; i < 5; ++i) {
    const Completion c = env_->wait_for("after-dead-engine-" + std::to_string(i), 20s);
    EXPECT_EQ(c.status, CompletionStatus::kFinished) << c.message;
    EXPECT_EQ(env_->wrong_words(reqs[i]), 0u);
  }
  const auto j = dump_json(instance);
  EXPECT_EQ(j["rings"][0]["skipped_records"], 1) << "the dead engine's record was skipped";
}

// A withdrawn request on a rank whose worker is stopped (it cannot confirm):
// the coordinator kills the worker, and the completion goes out only once its
// exit is confirmed, saying the blocks are free.
TEST_F(Faults, AWithdrawalIsCompletedOnlyAfterAnUnresponsiveWorkersExitIsConfirmed) {
  sim::RequestBlocks r{3, {30, 31}, {30, 31}};
  env_->fill(r);
  ASSERT_TRUE(env_->submit_task("stuck", r, 32, 2).ok());
  ASSERT_TRUE(env_->submit_dest("stuck", r).ok());
  usleep(100'000);  // both halves reach the ranks
  const uint32_t w1 = worker_pid(env_->prefill().name(), 1);
  ASSERT_NE(w1, 0u);
  kill(static_cast<pid_t>(w1), SIGSTOP);
  ASSERT_TRUE(env_->engine().cancel("stuck", Deadline::after(5s)).ok());
  const Completion c = env_->wait_for("stuck", 20s);
  EXPECT_FALSE(pid_exists(w1)) << "the completion came after the stopped worker's exit";
  EXPECT_EQ(c.status, CompletionStatus::kCancelled) << c.message;
  EXPECT_TRUE(c.blocks_reusable) << c.message;
  // The rank comes back (a new worker) and serves the next request.
  const Deadline until = Deadline::after(20s);
  auto back = [&] {
    const uint32_t now = worker_pid(env_->prefill().name(), 1);
    return now != 0 && now != w1 && env_->engine().rank_ready(1);
  };
  while (!back() && !until.passed())
    usleep(20'000);
  ASSERT_TRUE(back());
  sim::RequestBlocks next{4, {40}, {40}};
  run_request("after-stuck", next, 2, 3);
  EXPECT_EQ(env_->wait_for("after-stuck").status, CompletionStatus::kFinished);
  EXPECT_EQ(env_->wrong_words(next), 0u);
}

TEST_F(Faults, HostileRecordsAreAnsweredOrRefusedAndEveryOtherRequestCompletes) {
  auto control = ControlSegment::attach(env_->prefill().name());
  ASSERT_TRUE(control.ok());
  MpscProducer ring = control->submit_ring()->lease_producer().value();
  std::mt19937_64 rng(7);
  uint32_t hostile = 0;
  // Random bytes under every record type an engine may submit, and others.
  for (int i = 0; i < 200; ++i) {
    std::vector<std::byte> junk(8 * (1 + rng() % 40));
    for (auto& b : junk)
      b = std::byte(rng() & 0xff);
    // Every type but SessionHello, which is answered by a session's
    // acknowledgement rather than a completion.
    int32_t type = static_cast<int32_t>(1 + rng() % 16);
    if (type == static_cast<int32_t>(schema::MessageType::SESSION_HELLO)) type = 16;
    ASSERT_TRUE(ring.write(type, junk, Deadline::after(5s)).ok());
    ++hostile;
  }
  // Valid messages with hostile fields.
  auto send = [&](schema::MessageType type, capnp::MessageBuilder& m) {
    ASSERT_TRUE(messages::write_message(ring, type, m, Deadline::after(5s)).ok());
    ++hostile;
  };
  {
    capnp::MallocMessageBuilder m;
    testing::fill_cache_task(m.initRoot<schema::CacheTask>(), "out-of-range", {1, 99999}, 32, 0);
    send(schema::MessageType::CACHE_TASK, m);
  }
  {
    capnp::MallocMessageBuilder m;
    auto t = m.initRoot<schema::CacheTask>();
    t.setRequestId("huge-list");
    auto ids = t.initSrcBlockIds(30000);
    for (unsigned k = 0; k < 30000; ++k)
      ids.set(k, k % 256);
    t.setNeedPrefillTokens(16);
    send(schema::MessageType::CACHE_TASK, m);
  }
  {
    capnp::MallocMessageBuilder m;
    testing::fill_cache_task(m.initRoot<schema::CacheTask>(), std::string("bad\xff\xfe-utf8"), {1},
                             16, 0);
    send(schema::MessageType::CACHE_TASK, m);
  }
  {
    capnp::MallocMessageBuilder m;
    testing::fill_cache_task(m.initRoot<schema::CacheTask>(), std::string(500, 'x'), {1}, 16, 0);
    send(schema::MessageType::CACHE_TASK, m);
  }
  {
    capnp::MallocMessageBuilder m;
    m.initRoot<schema::Cancel>().setRequestId("cancel-of-nothing");
    send(schema::MessageType::CANCEL, m);
  }
  // Duplicate halves: the first is a live request, the second is refused.
  sim::RequestBlocks dup{90, {100}, {100}};
  env_->fill(dup);
  ASSERT_TRUE(env_->submit_task("dup-half", dup, 16, 5).ok());
  {
    capnp::MallocMessageBuilder m;
    testing::fill_cache_task(m.initRoot<schema::CacheTask>(), "dup-half", {100}, 16, 5);
    send(schema::MessageType::CACHE_TASK, m);
  }
  // Meanwhile, normal work.
  sim::RequestBlocks good{91, {101, 102}, {101, 102}};
  run_request("good", good, 1, 0);
  ASSERT_TRUE(env_->submit_dest("dup-half", dup).ok());
  env_->prefill_step(2, {{5, 0, 16, Client::request_tag("dup-half")}}, 4);

  uint32_t answered = 0;
  bool good_done = false, dup_done = false;
  for (uint32_t i = 0; i < hostile + 2; ++i) {
    auto c = env_->engine().wait(Deadline::after(20s));
    ASSERT_TRUE(c.ok()) << "after " << i << " completions: " << c.error().message;
    if (c->request_id == "good" && c->status == CompletionStatus::kFinished) {
      good_done = true;
    } else if (c->request_id == "dup-half" && c->status == CompletionStatus::kFinished) {
      dup_done = true;
    } else {
      EXPECT_NE(c->status, CompletionStatus::kFinished) << c->request_id;
      EXPECT_FALSE(c->message.empty()) << "every refusal says why";
      ++answered;
    }
  }
  EXPECT_EQ(answered, hostile) << "every hostile record got exactly one answer";
  EXPECT_TRUE(good_done);
  EXPECT_TRUE(dup_done);
  EXPECT_EQ(env_->wrong_words(good), 0u);
  EXPECT_EQ(env_->wrong_words(dup), 0u);
  EXPECT_EQ(env_->engine().wait(Deadline::after(200ms)).code(), Errc::kTimeout);
  EXPECT_TRUE(pid_exists(static_cast<uint32_t>(env_->prefill().pid())))
      << "the coordinator survived";
}

TEST(FaultProcesses, KilledCoordinatorIsNoticedByWorkersAndClientsAndANewOneTakesOver) {
  InstanceArgs d;
  d.instance = unique_instance("coord-kill-d");
  d.role = "decode";
  auto decode = Instance::start(d);
  InstanceArgs p = d;
  p.instance = unique_instance("coord-kill-p");
  p.role = "prefill";
  auto prefill = Instance::start(p);
  const uint32_t w0 = worker_pid(p.instance, 0);
  const uint64_t old_epoch = prefill->client().epoch();
  Client& client = prefill->client();
  prefill->kill9();

  EXPECT_TRUE(process_gone_within(w0, 5s)) << "the worker did not exit after its coordinator died";
  const uint64_t t0 = mono_now_ns();
  auto c = client.wait(Deadline::after(30s));
  EXPECT_EQ(c.code(), Errc::kCoordinatorGone) << (c ? "a completion" : c.error().message);
  RecordProperty("wait_to_coordinator_gone_ms", static_cast<int>((mono_now_ns() - t0) / 1'000'000));
  CacheTaskSpec t{"x", {1}, 16, 0, std::nullopt, 0};
  EXPECT_EQ(client.submit(t, Deadline::after(30s)).code(), Errc::kCoordinatorGone);

  // A new coordinator replaces the stale segment and serves requests.
  auto again = Instance::start(p);
  EXPECT_EQ(again->client().epoch(), old_epoch + 1);
  auto src = again->client().open_pool(0, PoolTier::kDevice).value();
  sim::RequestBlocks r{3, {1, 2}, {3, 4}};
  sim::fill_request(src, 0, r);
  ASSERT_TRUE(again->client()
                  .submit(CacheTaskSpec{"after-restart", r.src, 32, 0, std::nullopt, 0},
                          Deadline::after(5s))
                  .ok());
  CacheDestSpec dst;
  dst.request_id = "after-restart";
  dst.dest_block_ids = r.dst;
  dst.peer_instance = d.instance;
  dst.device_ids = {0};
  ASSERT_TRUE(again->client().submit(dst, Deadline::after(5s)).ok());
  const BatchSlot b{0, 0, 32, Client::request_tag("after-restart")};
  ASSERT_TRUE(again->client().push_batch(0, 1, std::span(&b, 1), Deadline::after(5s)).ok());
  for (uint32_t l = 0; l < 4; ++l)
    ASSERT_TRUE(again->client().push_layer_done(0, 1, l, Deadline::after(5s)).ok());
  auto done = again->client().wait(Deadline::after(20s));
  ASSERT_TRUE(done.ok()) << done.error().message;
  EXPECT_EQ(done->status, CompletionStatus::kFinished) << done->message;
  EXPECT_EQ(sim::check_request(decode->client().open_pool(0, PoolTier::kDevice).value(), 0, r), 0u);
  EXPECT_EQ(again->stop(), 0);
  EXPECT_EQ(decode->stop(), 0);
  EXPECT_TRUE(again->leftover_segments().empty());
}

// Another user, through setpriv: refused unless the instance has group access
// and the user is in its group.
class OtherUser : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another user";
    if (access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "needs setpriv (util-linux)";
  }
  std::string dump_as(uint32_t uid, uint32_t gid, const std::string& instance, int* code) {
    std::string out;
    *code = run_program(
        {"/usr/bin/setpriv", "--reuid=" + std::to_string(uid), "--regid=" + std::to_string(gid),
         "--clear-groups", Instance::bin("kvrelay-dump"), instance},
        &out);
    return out;
  }
};

TEST_F(OtherUser, IsRefusedOnAttachByDefault) {
  InstanceArgs a;
  a.instance = unique_instance("private");
  auto inst = Instance::start(a);
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm/kvrelay-" + a.instance).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  int code = 0;
  const std::string out = dump_as(65534, 65534, a.instance, &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("permission denied"), std::string::npos) << out;
  EXPECT_EQ(inst->stop(), 0);
}

TEST_F(OtherUser, MayAttachWithGroupAccessWhenInTheGroup) {
  InstanceArgs a;
  a.instance = unique_instance("shared");
  a.extra = {"--group-access"};
  auto inst = Instance::start(a);
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm/kvrelay-" + a.instance).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  int code = 0;
  std::string out = dump_as(65534, st.st_gid, a.instance, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("instance " + a.instance), std::string::npos) << out;
  out = dump_as(65534, 65534, a.instance, &code);
  EXPECT_NE(code, 0) << "not in the group: " << out;
  EXPECT_EQ(inst->stop(), 0);
}

}  // namespace
}  // namespace kvrelay::testing
