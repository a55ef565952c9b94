// Shared memory is input, and PID namespaces: a same-uid process scribbles on a live instance's rings and
// header, truncates its segments, zeroes the coordinator's recorded pid,
// owns a pool name as another user, or runs the coordinator in another pid
// namespace. Each costs at most the records it touched, is repaired or ends
// the instance cleanly, and kvrelay-dump tells the truth meanwhile.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "instance/control_segment.h"
#include "instance/names.h"
#include "integration/dump_json.h"
#include "integration/two_instances.h"
#include "schemas/codec.h"
#include "schemas/message_builders.h"
#include "schemas/records.h"
#include "shm/liveness.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;
namespace hdr = mpsc_header;

std::atomic<uint64_t>& record_header(const MpscRing& ring, uint64_t position) {
  auto* base = const_cast<std::byte*>(reinterpret_cast<const std::byte*>(&ring.header())) +
               sizeof(MpscRingHeader);
  return *reinterpret_cast<std::atomic<uint64_t>*>(base + (position & (ring.capacity() - 1)));
}

class SharedState : public ::testing::Test {
 protected:
  void SetUp() override {
    InstanceArgs a;
    a.tp = 2;
    a.layers = 4;
    a.blocks = 64;
    env_ = std::make_unique<TwoInstances>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), a);
    auto c = ControlSegment::attach(env_->prefill().name());
    ASSERT_TRUE(c.ok());
    control_ = std::make_unique<ControlSegment>(std::move(c).value());
  }
  void TearDown() override {
    control_.reset();
    if (env_ && !stopped_) env_->stop_and_check_clean();
  }
  // A request end to end: both halves, every layer, its completion.
  void expect_a_request_flows(const std::string& id, uint32_t block) {
    sim::RequestBlocks r{block, {block}, {block}};
    env_->fill(r);
    ASSERT_TRUE(env_->submit_task(id, r, 16, block % 8).ok());
    ASSERT_TRUE(env_->submit_dest(id, r).ok());
    env_->prefill_step(block, {{block % 8, 0, 16, Client::request_tag(id)}}, 4);
    const Completion c = env_->wait_for(id);
    EXPECT_EQ(c.status, CompletionStatus::kFinished) << id << ": " << c.message;
    EXPECT_EQ(env_->wrong_words(r), 0u);
  }
  std::unique_ptr<TwoInstances> env_;
  std::unique_ptr<ControlSegment> control_;
  bool stopped_ = false;
};

// A record longer than the limit whose boundaries are sound costs only that
// record: the cancels before and after it are answered, and it is too.
TEST_F(SharedState, AnOverLongRecordCostsOnlyItselfAndIsAnswered) {
  kill(env_->prefill().pid(), SIGSTOP);  // so that the records wait in the ring together
  MpscProducer raw = control_->submit_ring()->lease_producer().value();
  ASSERT_TRUE(env_->engine().cancel("c-before", Deadline::after(5s)).ok());
  const uint32_t max = raw.max_payload_bytes();
  auto big = raw.claim_for_test(max);
  ASSERT_TRUE(big.ok());
  auto extra = raw.claim_for_test(992);  // room the rewritten length will cover
  ASSERT_TRUE(extra.ok());
  record_header(raw.ring(), big->offset)
      .store(hdr::pack(static_cast<int32_t>(8 + max + 1000), 1, 0, 0));
  ASSERT_TRUE(env_->engine().cancel("c-after", Deadline::after(5s)).ok());
  kill(env_->prefill().pid(), SIGCONT);
  std::map<std::string, Completion> got;
  for (int i = 0; i < 3; ++i) {
    auto c = env_->engine().wait(Deadline::after(10s));
    ASSERT_TRUE(c.ok()) << c.error().message;
    got[c->request_id] = *c;
  }
  EXPECT_EQ(got.count("c-before"), 1u);
  EXPECT_EQ(got.count("c-after"), 1u);
  ASSERT_EQ(got.count(""), 1u) << "the over-long record is answered too";
  EXPECT_EQ(got[""].status, CompletionStatus::kRejected);
  EXPECT_NE(got[""].message.find("exceeds the ring's record limit"), std::string::npos)
      << got[""].message;
  EXPECT_GE(ring_json(dump_json(env_->prefill().name()), "submit")["corrupt_records"].get<int>(),
            1);
  expect_a_request_flows("after-long-record", 3);
}

// A length reaching past the tail (8 bytes written at a record's head): the
// records' boundaries are lost, so the instance declares itself broken, fails
// every live request with one completion each, and shuts down cleanly.
TEST_F(SharedState, RecordBoundariesLostEndTheInstanceCleanlyFailingEveryLiveRequest) {
  sim::RequestBlocks r{5, {5}, {5}};
  ASSERT_TRUE(env_->submit_task("live-one", r, 16, 0).ok());
  auto other = Client::attach(env_->prefill().name(), Deadline::after(5s));  // outlives stop()
  ASSERT_TRUE(other.ok());
  kill(env_->prefill().pid(), SIGSTOP);
  MpscRing submit = control_->submit_ring().value();
  const uint64_t at = submit.header().tail.load();
  ASSERT_TRUE(env_->engine().cancel("c-1", Deadline::after(5s)).ok());
  record_header(submit, at).store(hdr::pack(4000, 5, 0, 0));
  kill(env_->prefill().pid(), SIGCONT);
  const Completion c = env_->wait_for("live-one");
  EXPECT_EQ(c.status, CompletionStatus::kError);
  EXPECT_NE(c.message.find("cannot be trusted"), std::string::npos) << c.message;
  EXPECT_EQ(env_->prefill().stop(), 4) << "exit code 4: broken shared state";
  usleep(150'000);  // past the window in which a fresh heartbeat spares the lock check
  EXPECT_EQ(other->poll().code(), Errc::kCoordinatorGone);
  stopped_ = true;
  EXPECT_EQ(env_->decode().stop(), 0);
}

// An 8-byte header left at the head of an empty submit ring: the idle
// coordinator does not spin on it (it reached 95% of a core before).
TEST_F(SharedState, AHeaderAtTheHeadOfAnEmptyRingDoesNotMakeTheCoordinatorSpin) {
  MpscRing submit = control_->submit_ring().value();
  usleep(200'000);
  const uint64_t head = submit.header().head.load();
  ASSERT_EQ(head, submit.header().tail.load());
  record_header(submit, head).store(hdr::pack(24, 5, 0, 0));
  const pid_t coordinator = env_->prefill().pid();
  const uint64_t before = cpu_ticks(coordinator);
  usleep(1'000'000);
  const uint64_t used = cpu_ticks(coordinator) - before;
  std::fprintf(stderr, "idle coordinator with a stray header: %lu ticks in 1 s\n",
               static_cast<unsigned long>(used));
  EXPECT_LT(used, 20u) << "under a fifth of a core (the clock ticks 100 times a second)";
  expect_a_request_flows("after-stray-header", 4);
}

// Indices and words other processes can overwrite are repaired by their
// owner, each found once in the log and in kvrelay-dump's counters, and
// requests keep flowing. Workers do not restart: they judge the coordinator
// by its owner lock, not by the state word or the pid in its slot.
TEST_F(SharedState, OverwrittenIndicesStateAndPidAreRepairedAndRequestsKeepFlowing) {
  const std::string instance = env_->prefill().name();
  const uint32_t w0 = worker_pid(instance, 0), w1 = worker_pid(instance, 1);
  MpscRing submit = control_->submit_ring().value();
  MpscRing completion = control_->completion_ring().value();
  MpscRing task0 = control_->task_ring(0).value();
  uint32_t block = 8;
  auto scribble = [&](const char* what, const std::function<void()>& write) {
    SCOPED_TRACE(what);
    write();
    expect_a_request_flows(std::string("after-") + what, block++);
  };
  scribble("misaligned-submit-tail",
           [&] { const_cast<MpscRingHeader&>(submit.header()).tail.fetch_add(3); });
  scribble("far-submit-tail",
           [&] { const_cast<MpscRingHeader&>(submit.header()).tail.fetch_add(uint64_t{1} << 40); });
  scribble("completion-tail",
           [&] { const_cast<MpscRingHeader&>(completion.header()).tail.fetch_add(1 << 20); });
  scribble("task0-tail", [&] { const_cast<MpscRingHeader&>(task0.header()).tail.fetch_add(5); });
  scribble("report0-read-index", [&] {
    auto ring = control_->report_ring<records::WorkerReport>(0).value();
    const_cast<SpscRingHeader&>(ring.header()).read_index.fetch_add(1000);
  });
  scribble("state-dead", [&] {
    control_->header().state.store(static_cast<uint32_t>(InstanceState::kDead));
    usleep(300'000);
  });
  scribble("coordinator-pid", [&] {
    control_->coordinator_slot().pid.store(1);
    usleep(300'000);
  });
  EXPECT_EQ(worker_pid(instance, 0), w0) << "no worker restarted";
  EXPECT_EQ(worker_pid(instance, 1), w1);
  const auto dump = dump_json(instance);
  EXPECT_EQ(dump["health"], "healthy") << dump["problems"];
  EXPECT_EQ(dump["instance"]["state"], "ready");
  EXPECT_EQ(dump["coordinator"]["pid"].get<int>(), env_->prefill().pid());
  EXPECT_GE(dump["coordinator"]["counters"]["shared_state_repairs"].get<int>(), 5);
  EXPECT_GE(ring_json(dump, "submit")["corrupt_events"].get<int>(), 2);
}

// While a ring's shared state is impossible, kvrelay-dump says so: the
// instance is unhealthy, the ring's state names the problem.
TEST_F(SharedState, DumpShowsAnImpossibleRingAsUnhealthy) {
  kill(env_->prefill().pid(), SIGSTOP);  // nobody repairs it while we look
  MpscRing submit = control_->submit_ring().value();
  const_cast<MpscRingHeader&>(submit.header()).tail.fetch_add(3);
  const auto dump = dump_json(env_->prefill().name());
  std::string text;
  run_program({Instance::bin("kvrelay-dump"), env_->prefill().name()}, &text);
  kill(env_->prefill().pid(), SIGCONT);
  EXPECT_EQ(dump["health"], "unhealthy");
  EXPECT_EQ(ring_json(dump, "submit")["state"], "impossible indices");
  EXPECT_NE(text.find("health unhealthy"), std::string::npos) << text;
  EXPECT_NE(text.find("corrupt"), std::string::npos);
  expect_a_request_flows("after-dump", 6);
}

// A same-uid process zeroes the recorded creator pid: the instance is still
// alive (its coordinator holds the owner lock), so a second coordinator for
// the same name is refused rather than taking the segments over.
TEST_F(SharedState, AZeroedCreatorPidDoesNotLetASecondCoordinatorIn) {
  control_->header().preamble.creator_pid = 0;
  std::string out;
  const int code = run_program({Instance::bin("kvrelay-coordinator"), "--instance",
                                env_->prefill().name(), "--role", "prefill", "--tp-size", "2"},
                               &out);
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("already served"), std::string::npos) << out;
  expect_a_request_flows("after-second-coordinator", 7);
}

// Another process truncates the source pool under a transfer: the worker's
// copy hits SIGBUS, which becomes an error of that request naming the rank;
// the worker exits, is restarted, recreates its pool, and serves the next.
TEST_F(SharedState, APoolTruncatedUnderACopyFailsThatRequestAndTheRankRecovers) {
  const std::string pool = pool_segment_name(env_->prefill().name(), "pool", 0);
  const uint32_t old_worker = worker_pid(env_->prefill().name(), 0);
  sim::RequestBlocks r{2, {2}, {2}};
  ASSERT_TRUE(env_->submit_task("on-truncated", r, 16, 1).ok());
  ASSERT_TRUE(env_->submit_dest("on-truncated", r).ok());
  const int fd = shm_open(("/" + pool).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  env_->prefill_step(1, {{1, 0, 16, Client::request_tag("on-truncated")}}, 4);
  const Completion c = env_->wait_for("on-truncated");
  EXPECT_EQ(c.status, CompletionStatus::kError);
  EXPECT_EQ(c.error_rank, 0);
  EXPECT_TRUE(c.message.find("truncated") != std::string::npos ||
              c.message.find("died") != std::string::npos)
      << c.message;
  const Deadline until = Deadline::after(20s);
  auto back = [&] {
    const uint32_t now = worker_pid(env_->prefill().name(), 0);
    return now != 0 && now != old_worker && env_->engine().rank_ready(0);
  };
  while (!back() && !until.passed())
    usleep(20'000);
  ASSERT_TRUE(back()) << "rank 0 is back, served by a new worker";
  // The test's own mapping of the old pool is gone: map the new one.
  auto fresh = env_->engine().open_pool(0, PoolTier::kDevice);
  ASSERT_TRUE(fresh.ok()) << fresh.error().message;
  EXPECT_EQ(fresh->check_intact().code(), Errc::kOk);
  sim::RequestBlocks next{3, {3}, {3}};
  sim::fill_request(*fresh, 0, next);
  sim::fill_request(env_->src_pool(1), 1, next);
  ASSERT_TRUE(env_->submit_task("after-truncation", next, 16, 2).ok());
  ASSERT_TRUE(env_->submit_dest("after-truncation", next).ok());
  env_->prefill_step(2, {{2, 0, 16, Client::request_tag("after-truncation")}}, 4);
  EXPECT_EQ(env_->wait_for("after-truncation").status, CompletionStatus::kFinished);
  EXPECT_EQ(sim::check_request(env_->dst_pool(0), 0, next), 0u);
}

// The control segment itself truncated: the coordinator does not die of
// SIGBUS; it finds its shared state gone and shuts down (exit code 4).
TEST_F(SharedState, ATruncatedControlSegmentEndsTheInstanceWithoutACrash) {
  auto other = Client::attach(env_->prefill().name(), Deadline::after(5s));  // outlives stop()
  ASSERT_TRUE(other.ok());
  const int fd = shm_open(("/" + control_segment_name(env_->prefill().name())).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  control_.reset();
  EXPECT_EQ(env_->prefill().stop(std::chrono::seconds(20)), 4) << "not 128 + SIGBUS";
  usleep(150'000);
  const Status s = other->cancel("x", Deadline::after(1s));
  EXPECT_EQ(s.code(), Errc::kCoordinatorGone) << s.error().message;
  stopped_ = true;
  EXPECT_EQ(env_->decode().stop(), 0);
}

TEST(SharedStateProcesses, AnotherUsersPoolIsNeverUnlinkedAndTheRankIsGivenUpAtOnce) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a segment of another uid";
  const std::string instance = unique_instance("foreign-pool");
  const std::string pool = pool_segment_name(instance, "pool", 0);
  const int fd = shm_open(("/" + pool).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  ASSERT_EQ(fchown(fd, 65534, 65534), 0);
  close(fd);
  std::string out;
  const uint64_t t0 = mono_now_ns();
  const int code = run_program({Instance::bin("kvrelay-coordinator"), "--instance", instance,
                                "--tp-size", "1", "--num-blocks", "16", "--num-layers", "2"},
                               &out, 60s);
  const double seconds = (mono_now_ns() - t0) / 1e9;
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("belongs to uid 65534"), std::string::npos) << out;
  EXPECT_NE(out.find("not restarting it"), std::string::npos) << out;
  EXPECT_LT(seconds, 20.0) << "given up at once, not after the startup timeout";
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm/" + pool).c_str(), &st), 0) << "the other user's pool is still there";
  EXPECT_EQ(st.st_uid, 65534u);
  (void)unlink(("/dev/shm/" + pool).c_str());
}

TEST(SharedStateProcesses, GroupAccessMakesThePoolsGroupReadableToo) {
  InstanceArgs a;
  a.instance = unique_instance("group-pools");
  a.host_blocks = 8;
  a.extra = {"--group-access"};
  auto inst = Instance::start(a);
  for (const std::string& name : inst->leftover_segments()) {
    struct stat st {};
    ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0660u) << name;
  }
  EXPECT_EQ(inst->leftover_segments().size(), 3u) << "control, device pool, host pool";
  EXPECT_EQ(inst->stop(), 0);
}

// A coordinator in its own pid namespace (a container sharing /dev/shm but
// not pids): its pid means nothing outside, yet the instance is alive to an
// engine outside, serves it, refuses a second coordinator, and is seen gone
// the moment it dies.
TEST(SharedStateProcesses, ACoordinatorInAnotherPidNamespaceIsJudgedByItsLockNotItsPid) {
  if (geteuid() != 0 || access("/usr/bin/unshare", X_OK) != 0)
    GTEST_SKIP() << "needs root and unshare (util-linux) for a pid namespace";
  const std::string instance = unique_instance("pidns");
  const pid_t outer = spawn_program({"/usr/bin/unshare", "--pid", "--fork", "--kill-child",
                                     Instance::bin("kvrelay-coordinator"), "--instance", instance,
                                     "--tp-size", "1", "--num-blocks", "16", "--num-layers", "2",
                                     "--role", "mixed", "--num-host-blocks", "8"});
  ASSERT_GT(outer, 0);
  auto client = Client::attach(instance, Deadline::after(30s));
  ASSERT_TRUE(client.ok()) << client.error().message;
  auto c = ControlSegment::attach(instance);
  ASSERT_TRUE(c.ok()) << "not stale, although its pid is another namespace's";
  EXPECT_EQ(c->coordinator_liveness(), LockState::kHeld);
  SwapSpec s;
  s.request_id = "across-namespaces";
  s.device_block_ids = {1};
  s.host_block_ids = {1};
  ASSERT_TRUE(client->submit(s, Deadline::after(5s)).ok());
  auto done = client->wait(Deadline::after(20s));
  ASSERT_TRUE(done.ok()) << done.error().message;
  EXPECT_EQ(done->status, CompletionStatus::kFinished) << done->message;
  std::string out;
  EXPECT_EQ(
      run_program({Instance::bin("kvrelay-coordinator"), "--instance", instance, "--tp-size", "1"},
                  &out),
      3)
      << out;
  kill_child(outer);  // --kill-child: the namespace's processes go with it
  const Deadline until = Deadline::after(10s);
  while (c->coordinator_liveness() != LockState::kFree && !until.passed())
    usleep(10'000);
  EXPECT_EQ(c->coordinator_liveness(), LockState::kFree);
  usleep(150'000);
  EXPECT_EQ(client->cancel("x", Deadline::after(2s)).code(), Errc::kCoordinatorGone);
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string n = e.path().filename().string();
    if (n.find(instance) != std::string::npos) (void)unlink(e.path().c_str());
  }
}

}  // namespace
}  // namespace kvrelay::testing
