// Engines that die and restart, and engines that send what they should not,
// against real coordinator and worker processes.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "instance/control_segment.h"
#include "integration/dump_json.h"
#include "integration/two_instances.h"
#include "shm/liveness.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

uint64_t coordinator_counter(const std::string& instance, const std::string& label) {
  const auto j = dump_json(instance);
  if (j.is_discarded()) return 0;
  return j["coordinator"]["counters"].value(label, uint64_t{0});
}

class Engines : public ::testing::Test {
 protected:
  void SetUp() override {
    InstanceArgs a;
    a.tp = 2;
    a.layers = 4;
    a.blocks = 256;
    a.deadline_ms = 60'000;  // withdrawals must not wait for it
    env_ = std::make_unique<TwoInstances>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), a);
  }
  void TearDown() override {
    if (env_) env_->stop_and_check_clean();
  }
  std::unique_ptr<TwoInstances> env_;
};

CacheTaskSpec task_of(const std::string& id, const sim::RequestBlocks& r, uint32_t slot) {
  CacheTaskSpec t;
  t.request_id = id;
  t.src_block_ids = r.src;
  t.need_prefill_tokens = r.src.size() * 16;
  t.engine_slot = slot;
  return t;
}

CacheDestSpec dest_of(const std::string& id, const sim::RequestBlocks& r, const std::string& peer,
                      uint32_t tp) {
  CacheDestSpec d;
  d.request_id = id;
  d.dest_block_ids = r.dst;
  d.protocol = Protocol::kIpc;
  d.peer_instance = peer;
  for (uint32_t rank = 0; rank < tp; ++rank)
    d.device_ids.push_back(rank);
  return d;
}

void push_chunk(Client& c, uint32_t tp, uint64_t step, const std::vector<BatchSlot>& batch) {
  for (uint32_t rank = 0; rank < tp; ++rank) {
    ASSERT_TRUE(c.push_batch(rank, step, batch, Deadline::after(5s)).ok());
    for (uint32_t l = 0; l < 4; ++l)
      ASSERT_TRUE(c.push_layer_done(rank, step, l, Deadline::after(5s)).ok());
  }
}

// An engine is SIGKILLed with requests in flight; a new engine process
// attaches and reuses the same request ids (a deterministic scheme) with new
// blocks and the same tags. The old requests are withdrawn at once (not at
// their 60 s deadline), the new engine's signals drive only its own requests,
// every byte it receives is its own, nothing is written outside its blocks,
// and it gets exactly one completion per request and none of the dead one's.
TEST_F(Engines, ARestartedEngineReusingRequestIdsGetsItsOwnTransfersOnly) {
  constexpr uint32_t kRequests = 6;
  const uint32_t tp = env_->tp();
  const std::string prefill = env_->prefill().name();
  const std::string decode = env_->decode().name();
  std::vector<sim::RequestBlocks> old_blocks, new_blocks;
  for (uint32_t i = 0; i < kRequests; ++i) {
    old_blocks.push_back({100 + i, {2 * i, 2 * i + 1}, {2 * i, 2 * i + 1}});
    new_blocks.push_back({200 + i, {40 + 2 * i, 41 + 2 * i}, {40 + 2 * i, 41 + 2 * i}});
  }
  for (uint32_t rank = 0; rank < tp; ++rank)
    for (uint32_t b = 0; b < 128; ++b)
      for (uint32_t l = 0; l < 4; ++l)
        for (uint32_t t = 0; t < 2; ++t)
          sim::poison_block(env_->dst_pool(rank), l, t, b);
  for (const auto& r : old_blocks)
    env_->fill(r);

  ReadyPipe half_done;
  const pid_t old_engine = fork_child([&] {
    auto c = Client::attach(prefill, Deadline::after(10s));
    if (!c) return 2;
    std::vector<BatchSlot> batch;
    for (uint32_t i = 0; i < kRequests; ++i) {
      const std::string id = "req-" + std::to_string(i);
      if (!c->submit(task_of(id, old_blocks[i], i), Deadline::after(5s)).ok()) return 3;
      if (!c->submit(dest_of(id, old_blocks[i], decode, tp), Deadline::after(5s)).ok()) return 4;
      batch.push_back({i, 0, 16, Client::request_tag(id)});  // the first of two blocks
    }
    push_chunk(*c, tp, 1, batch);
    half_done.signal();
    pause();
    return 0;
  });
  ASSERT_TRUE(half_done.wait(10s));
  usleep(100'000);  // let the first blocks go
  kill_child(old_engine);

  const uint64_t t0 = mono_now_ns();
  auto fresh = Client::attach(prefill, Deadline::after(10s));
  ASSERT_TRUE(fresh.ok()) << fresh.error().message;
  std::vector<BatchSlot> batch;
  for (uint32_t i = 0; i < kRequests; ++i) {
    const std::string id = "req-" + std::to_string(i);
    env_->fill(new_blocks[i]);
    ASSERT_TRUE(fresh->submit(task_of(id, new_blocks[i], i), Deadline::after(5s)).ok());
    ASSERT_TRUE(fresh->submit(dest_of(id, new_blocks[i], decode, tp), Deadline::after(5s)).ok());
    batch.push_back({i, 0, 32, Client::request_tag(id)});
  }
  push_chunk(*fresh, tp, 1, batch);  // the new engine's steps start again at 1, too
  std::map<std::string, int> seen;
  for (uint32_t i = 0; i < kRequests; ++i) {
    auto c = fresh->wait(Deadline::after(20s));
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->status, CompletionStatus::kFinished) << c->request_id << ": " << c->message;
    ++seen[c->request_id];
  }
  const double seconds = (mono_now_ns() - t0) / 1e9;
  std::fprintf(stderr, "the new engine's %u requests finished %.2f s after its predecessor died\n",
               kRequests, seconds);
  // Not a speed target, and not asserted: that the old requests were
  // withdrawn rather than left to their 60 s deadline is checked below by
  // the coordinator's own count (session_withdrawals), which no machine's
  // load can blur.
  EXPECT_EQ(fresh->wait(Deadline::after(300ms)).code(), Errc::kTimeout) << "nothing of the old";
  for (uint32_t i = 0; i < kRequests; ++i) {
    EXPECT_EQ(seen["req-" + std::to_string(i)], 1);
    EXPECT_EQ(env_->wrong_words(new_blocks[i]), 0u) << "request " << i;
  }
  // Nothing outside the requests' blocks: the dead engine's second blocks
  // (never computed) must not have been written by the new engine's signals.
  for (uint32_t rank = 0; rank < tp; ++rank)
    for (uint32_t i = 0; i < kRequests; ++i)
      EXPECT_TRUE(sim::block_is_poisoned(env_->dst_pool(rank), 3, 0, old_blocks[i].dst[1]))
          << "rank " << rank << " block " << old_blocks[i].dst[1];
  EXPECT_GE(coordinator_counter(prefill, "sessions_died"), 1u);
  EXPECT_EQ(coordinator_counter(prefill, "session_withdrawals"), kRequests);
}

// Completions of a session that died are dropped, not handed to whoever
// reads next.
TEST_F(Engines, CompletionsOfADeadSessionAreNotHandedToTheNextEngine) {
  const std::string prefill = env_->prefill().name();
  const pid_t old_engine = fork_child([&] {
    auto c = Client::attach(prefill, Deadline::after(10s));
    if (!c) return 2;
    if (!c->cancel("nothing-by-this-name", Deadline::after(5s)).ok()) return 3;
    pause();
    return 0;
  });
  const Deadline until = Deadline::after(10s);
  while (coordinator_counter(prefill, "submissions_rejected") == 0 && !until.passed())
    usleep(10'000);
  ASSERT_EQ(coordinator_counter(prefill, "submissions_rejected"), 1u) << "its answer was written";
  kill_child(old_engine);
  {
    auto next = Client::attach(prefill, Deadline::after(10s));
    ASSERT_TRUE(next.ok());
    EXPECT_EQ(next->wait(Deadline::after(300ms)).code(), Errc::kTimeout);
    EXPECT_EQ(next->dropped_completions(), 1u);
    EXPECT_EQ(env_->engine().poll().code(), Errc::kBusy) << "one reader at a time";
  }
  // Once that reader is gone, the env's own client reads, and finds nothing.
  EXPECT_EQ(env_->engine().wait(Deadline::after(100ms)).code(), Errc::kTimeout);
}

// An engine that detaches cleanly leaves its requests running: their
// completions reach the reader.
TEST_F(Engines, AClientThatDetachesCleanlyLeavesItsRequestsRunning) {
  sim::RequestBlocks r{7, {10}, {10}};
  env_->fill(r);
  {
    auto submitter = Client::attach(env_->prefill().name(), Deadline::after(10s));
    ASSERT_TRUE(submitter.ok());
    ASSERT_TRUE(submitter->submit(task_of("handed-off", r, 3), Deadline::after(5s)).ok());
    ASSERT_TRUE(submitter
                    ->submit(dest_of("handed-off", r, env_->decode().name(), env_->tp()),
                             Deadline::after(5s))
                    .ok());
  }
  env_->prefill_step(1, {{3, 0, 16, Client::request_tag("handed-off")}}, 4);
  const Completion c = env_->wait_for("handed-off");
  EXPECT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  EXPECT_EQ(env_->wrong_words(r), 0u);
}

TEST_F(Engines, AnErrorTextOf130KBEndsTheRequestWithOneCappedCompletion) {
  CacheDestSpec d;
  d.request_id = "huge-error";
  d.error_message = std::string(130'700, 'e');
  ASSERT_TRUE(env_->engine().submit(d, Deadline::after(5s)).ok());
  const Completion c = env_->wait_for("huge-error");
  EXPECT_EQ(c.status, CompletionStatus::kError);
  EXPECT_LT(c.message.size(), 2048u);
  EXPECT_NE(c.message.find("more bytes]"), std::string::npos);
}

TEST_F(Engines, DeviceIdsAreHonouredAndCheckedAndOnlyADecodeInstanceIsADestination) {
  sim::RequestBlocks r{9, {20}, {20}};
  env_->fill(r);
  CacheDestSpec d = dest_of("swapped", r, env_->decode().name(), 2);
  d.device_ids = {1, 0};  // rank 0's blocks go to decode rank 1, and rank 1's to rank 0
  ASSERT_TRUE(env_->engine().submit(task_of("swapped", r, 1), Deadline::after(5s)).ok());
  ASSERT_TRUE(env_->engine().submit(d, Deadline::after(5s)).ok());
  env_->prefill_step(1, {{1, 0, 16, Client::request_tag("swapped")}}, 4);
  const Completion c = env_->wait_for("swapped");
  ASSERT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  EXPECT_EQ(sim::check_request(env_->dst_pool(1), 0, r), 0u) << "rank 0's data in decode rank 1";
  EXPECT_EQ(sim::check_request(env_->dst_pool(0), 1, r), 0u) << "rank 1's data in decode rank 0";

  const struct {
    std::string id;
    std::string peer;
    std::vector<uint32_t> devices;
    std::string want;
  } bad[] = {
      {"dup-rank", env_->decode().name(), {0, 0}, "names decode rank 0 twice"},
      {"far-rank", env_->decode().name(), {0, 5}, "device_ids[1] = 5 is out of range"},
      {"to-self", env_->prefill().name(), {0, 1}, "is this instance itself"},
  };
  for (const auto& b : bad) {
    CacheDestSpec x = dest_of(b.id, r, b.peer, 2);
    x.device_ids = b.devices;
    ASSERT_TRUE(env_->engine().submit(x, Deadline::after(5s)).ok());
    const Completion e = env_->wait_for(b.id);
    EXPECT_EQ(e.status, CompletionStatus::kError);
    EXPECT_NE(e.message.find(b.want), std::string::npos) << e.message;
  }
}

TEST_F(Engines, APrefillInstanceIsRefusedAsADestination) {
  InstanceArgs other;
  other.instance = unique_instance("other-prefill");
  other.role = "prefill";
  other.tp = 2;
  other.layers = 4;
  other.blocks = 256;
  auto second = Instance::start(other);
  sim::RequestBlocks r{9, {20}, {20}};
  ASSERT_TRUE(
      env_->engine().submit(dest_of("to-prefill", r, other.instance, 2), Deadline::after(5s)).ok());
  const Completion e = env_->wait_for("to-prefill");
  EXPECT_EQ(e.status, CompletionStatus::kError);
  EXPECT_NE(e.message.find("has role prefill; only a decode instance"), std::string::npos)
      << e.message;
  EXPECT_EQ(second->stop(), 0);
}

TEST_F(Engines, RequestIdsWithANulAndOutOfRangeSignalsAreRefusedAtTheClient) {
  Client& c = env_->engine();
  sim::RequestBlocks r{1, {1}, {1}};
  Status s = c.submit(task_of(std::string("alias\0one", 9), r, 0), Deadline::after(1s));
  EXPECT_EQ(s.code(), Errc::kInvalidArgument);
  EXPECT_NE(s.error().message.find("NUL"), std::string::npos);
  EXPECT_EQ(c.cancel(std::string("alias\0two", 9), Deadline::after(1s)).code(),
            Errc::kInvalidArgument);
  const std::vector<BatchSlot> far = {{1'000'000, 0, 16, 0}};
  s = c.push_batch(0, 1, far, Deadline::after(1s));
  EXPECT_EQ(s.code(), Errc::kInvalidArgument);
  EXPECT_NE(s.error().message.find("slot 1000000 is out of range"), std::string::npos);
  s = c.push_layer_done(0, 1, 1'000'000, Deadline::after(1s));
  EXPECT_EQ(s.code(), Errc::kInvalidArgument);
  EXPECT_NE(s.error().message.find("layer 1000000 is out of range"), std::string::npos);
}

// A million cancels for unknown ids with nobody reading the completions: the
// completion ring fills, the coordinator stops reading submissions, the
// engine sees `full`; the coordinator's memory does not grow.
TEST_F(Engines, AFloodOfCancelsWithASlowReaderMeetsBackpressureNotGrowth) {
  Client& c = env_->engine();
  const pid_t coordinator = env_->prefill().pid();
  const uint64_t rss_before = rss_kib(coordinator);
  uint64_t accepted = 0, full = 0;
  const Deadline until = Deadline::after(15s);
  for (int i = 0; i < 1'000'000 && !until.passed(); ++i) {
    Status s = c.cancel("flood-" + std::to_string(i), Deadline::now());
    if (s.ok()) {
      ++accepted;
    } else {
      ASSERT_EQ(s.code(), Errc::kFull) << s.error().message;
      if (++full > 2000) break;  // pushed back for long enough
      usleep(200);
    }
  }
  const uint64_t rss_after = rss_kib(coordinator);
  std::fprintf(stderr, "flood: %lu accepted, %lu refused as full; coordinator RSS %lu -> %lu KiB\n",
               static_cast<unsigned long>(accepted), static_cast<unsigned long>(full),
               static_cast<unsigned long>(rss_before), static_cast<unsigned long>(rss_after));
  EXPECT_GT(full, 0u) << "the engine was pushed back";
  EXPECT_LT(rss_after, rss_before + 32 * 1024 * sanitizer_memory_factor())
      << "memory stays bounded";
  // Everything accepted is answered exactly once.
  std::set<std::string> ids;
  for (uint64_t i = 0; i < accepted; ++i) {
    auto done = c.wait(Deadline::after(20s));
    ASSERT_TRUE(done.ok()) << done.error().message << " after " << i;
    EXPECT_EQ(done->kind, CompletionKind::kCancel);
    ids.insert(done->request_id);
  }
  EXPECT_EQ(ids.size(), accepted);
}

// The coordinator dies: every client call says so within the same bound, and
// attaching to the stale instance fails at once instead of waiting it out.
TEST(EngineProcesses, EveryClientCallReportsAGoneCoordinatorPromptly) {
  InstanceArgs a;
  a.instance = unique_instance("gone");
  a.host_blocks = 16;
  auto inst = Instance::start(a);
  Client& c = inst->client();
  inst->kill9();
  usleep(150'000);  // its heartbeat is now older than the fresh-heartbeat window
  const std::vector<BatchSlot> batch = {{0, 0, 16, 0}};
  // Each call could wait this long, far past this test's own ctest timeout
  // (300 s): that it answers at all shows it saw the coordinator gone rather
  // than waiting for its deadline, with no clock in the check.
  constexpr auto kCallTimeout = std::chrono::hours(1);
  const struct {
    const char* name;
    std::function<Errc()> call;
  } calls[] = {
      {"poll", [&] { return c.poll().code(); }},
      {"wait", [&] { return c.wait(Deadline::after(kCallTimeout)).code(); }},
      {"submit",
       [&] {
         sim::RequestBlocks r{1, {1}, {1}};
         return c.submit(task_of("after-death", r, 0), Deadline::after(kCallTimeout)).code();
       }},
      {"cancel", [&] { return c.cancel("x", Deadline::after(kCallTimeout)).code(); }},
      {"push_batch", [&] { return c.push_batch(0, 1, batch, Deadline::after(kCallTimeout)).code(); }},
      {"push_layer_done", [&] { return c.push_layer_done(0, 1, 0, Deadline::after(kCallTimeout)).code(); }},
      {"wait_layer", [&] { return c.wait_layer("nope", 0, Deadline::after(kCallTimeout)).code(); }},
  };
  for (const auto& call : calls)
    EXPECT_EQ(call.call(), Errc::kCoordinatorGone) << call.name;
  auto stale = Client::attach(a.instance, Deadline::after(kCallTimeout));
  EXPECT_EQ(stale.code(), Errc::kCoordinatorGone);
  EXPECT_NE(stale.error().message.find("is stale"), std::string::npos) << stale.error().message;
}

// Killing the simulator takes its instances (coordinators and workers) and
// their 2 GiB-sized pools with it.
TEST(EngineProcesses, KillingTheSimulatorTakesItsInstancesWithIt) {
  const std::string p = unique_instance("simkill-p");
  const std::string d = unique_instance("simkill-d");
  const pid_t sim = spawn_program({Instance::bin("kvrelay-sim"), "--start", "--prefill", p,
                                   "--decode", d, "--tp", "2", "--layers", "4", "--blocks", "64",
                                   "--requests", "100000", "--timeout-s", "600"});
  ASSERT_GT(sim, 0);
  auto exists = [&](const std::string& name) {
    return std::filesystem::exists("/dev/shm/kvrelay-" + name);
  };
  const Deadline up = Deadline::after(30s);
  while (!(exists(p) && exists(d)) && !up.passed())
    usleep(20'000);
  ASSERT_TRUE(exists(p) && exists(d));
  usleep(500'000);
  kill_child(sim);
  const Deadline gone = Deadline::after(30s);
  while ((exists(p) || exists(d)) && !gone.passed())
    usleep(50'000);
  EXPECT_FALSE(exists(p)) << "the prefill instance went with the simulator";
  EXPECT_FALSE(exists(d)) << "the decode instance went with the simulator";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string n = e.path().filename().string();
    EXPECT_TRUE(n.find(p) == std::string::npos && n.find(d) == std::string::npos)
        << n << " was left behind";
  }
}

// Killing either coordinator under a running simulator stops it at once,
// saying which instance is gone, instead of spinning until its timeout.
class SimulatorOnADeadInstance : public ::testing::TestWithParam<bool> {};

TEST_P(SimulatorOnADeadInstance, StopsAndSaysWhichInstanceIsGone) {
  // Names of each case's own: the killed coordinator leaves its instance
  // behind, and both cases may run in one process.
  const std::string which = GetParam() ? "-kp" : "-kd";
  const std::string p = unique_instance("simdead-p" + which);
  const std::string d = unique_instance("simdead-d" + which);
  const std::string victim = GetParam() ? p : d;
  std::string out;
  int code = -1;
  std::thread sim([&] {
    code = run_program(
        {Instance::bin("kvrelay-sim"), "--start", "--prefill", p, "--decode", d, "--tp", "2",
         "--layers", "4", "--blocks", "64", "--requests", "100000", "--timeout-s", "600"},
        &out, 60s);
  });
  uint32_t pid = 0;
  const Deadline up = Deadline::after(30s);
  while (pid == 0 && !up.passed()) {
    const auto j = dump_json(victim);
    if (!j.is_discarded() && j["instance"].value("state", "") == "ready")
      pid = j["coordinator"].value("pid", 0u);
    if (pid == 0) usleep(50'000);
  }
  ASSERT_NE(pid, 0u) << victim << " never became ready";
  usleep(300'000);  // requests in flight
  kill(static_cast<pid_t>(pid), SIGKILL);
  sim.join();
  // Exit code 1, not run_program's -1: the simulator stopped by itself within
  // the 60 s it was given, not at its own --timeout-s of 600 s.
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("ABORTED"), std::string::npos) << out;
  EXPECT_NE(out.find("'" + victim + "'"), std::string::npos) << "names the instance:\n" << out;

  // The killed coordinator could not remove its instance's segments: clean
  // them as an operator would, once its workers have followed it (every
  // run of the suite left them in /dev/shm before).
  auto left_behind = [&] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
      n += e.path().filename().string().find(victim) != std::string::npos ? 1 : 0;
    return n;
  };
  std::string cleaned;
  const Deadline clean = Deadline::after(20s);
  while (left_behind() > 0 && !clean.passed()) {
    (void)run_program({Instance::bin("kvrelay-dump"), "--clean-stale", victim}, &cleaned, 10s);
    if (left_behind() > 0) usleep(100'000);
  }
  EXPECT_EQ(left_behind(), 0) << "the dead instance's segments were not cleaned:\n" << cleaned;
}

INSTANTIATE_TEST_SUITE_P(Coordinators, SimulatorOnADeadInstance, ::testing::Bool(),
                         [](const auto& p) { return p.param ? "Prefill" : "Decode"; });

}  // namespace
}  // namespace kvrelay::testing
