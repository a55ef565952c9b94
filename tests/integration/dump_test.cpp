// kvrelay-dump against real instances: known traffic, JSON, a stale
// segment, corrupted headers, and decoding a waiting CacheTask.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "instance/control_segment.h"
#include "instance/names.h"
#include "integration/dump_json.h"
#include "integration/two_instances.h"
#include "schemas/records.h"
#include "shm/clock.h"
#include "shm/spsc_ring.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

class DumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InstanceArgs a;
    a.tp = 2;
    a.layers = 3;
    env_ = std::make_unique<TwoInstances>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), a);
  }
  void TearDown() override {
    if (env_) env_->stop_and_check_clean();
  }
  // Moves `n` 2-block requests through.
  void traffic(uint32_t n) {
    for (uint32_t i = 0; i < n; ++i) {
      sim::RequestBlocks r{i + 1, {2 * i, 2 * i + 1}, {2 * i, 2 * i + 1}};
      env_->fill(r);
      const std::string id = "t" + std::to_string(i);
      ASSERT_TRUE(env_->submit_task(id, r, 2 * 16, 0).ok());
      ASSERT_TRUE(env_->submit_dest(id, r).ok());
      env_->prefill_step(i + 1, {{0, 0, 32, Client::request_tag(id)}}, 3);
      ASSERT_EQ(env_->wait_for(id).status, CompletionStatus::kFinished);
    }
  }
  std::unique_ptr<TwoInstances> env_;
};

TEST_F(DumpTest, TextOutputShowsTheInstanceItsWorkersAndTheTraffic) {
  traffic(5);
  int code = -1;
  const std::string out = kvrelay_dump({env_->prefill().name()}, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out.rfind("health healthy\n", 0), 0u) << "the first line says the health: " << out;
  EXPECT_NE(out.find("instance " + env_->prefill().name()), std::string::npos) << out;
  EXPECT_NE(out.find("ready"), std::string::npos);
  EXPECT_NE(out.find("role prefill"), std::string::npos);
  EXPECT_NE(out.find("requests_finished 5"), std::string::npos) << out;
  EXPECT_NE(out.find("task[1]"), std::string::npos);
  EXPECT_NE(out.find("signal_to_copy_done"), std::string::npos) << "latency histograms are shown";
  EXPECT_NE(out.find("barrier  generation"), std::string::npos);
  EXPECT_NE(out.find("woken    coordinator "), std::string::npos) << "doorbell wake-ups are shown";
  EXPECT_NE(out.find("nothing sent or received over tcp or rdma yet"), std::string::npos)
      << "ipc traffic only";
}

TEST_F(DumpTest, JsonParsesAndHoldsTheExpectedValues) {
  traffic(3);
  int code = -1;
  const std::string out = kvrelay_dump({env_->prefill().name(), "--json"}, &code);
  ASSERT_EQ(code, 0) << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["schema"], "kvrelay-dump/1");
  EXPECT_EQ(j["instance"]["name"], env_->prefill().name());
  EXPECT_EQ(j["instance"]["state"], "ready");
  EXPECT_FALSE(j["instance"]["stale"].get<bool>());
  EXPECT_EQ(j["config"]["tp_size"], 2);
  EXPECT_EQ(j["config"]["num_layers"], 3);
  EXPECT_EQ(j["coordinator"]["counters"]["requests_finished"], 3);
  ASSERT_EQ(j["workers"].size(), 2u);
  uint64_t bytes = 0, finished = 0, unrung = 0;
  for (const auto& w : j["workers"]) {
    EXPECT_EQ(w["health"], "healthy");
    EXPECT_TRUE(w["ready"].get<bool>());
    ASSERT_GE(w["pools"].size(), 1u);
    EXPECT_EQ(w["pools"][0]["tier"], "device");
    EXPECT_EQ(w["pools"][0]["location"], "host-segment") << "the worker's own pool";
    EXPECT_GT(w["pools"][0]["bytes"].get<uint64_t>(), 0u);
    EXPECT_EQ(w["device_signal_word"], 0) << "no GPU signalled anything";
    bytes += w["counters"]["bytes_copied"].get<uint64_t>();
    finished += w["counters"]["requests_finished"].get<uint64_t>();
    unrung += w["counters"]["reports_without_wake"].get<uint64_t>();
  }
  const PoolGeometry& g = env_->src_pool(0).geometry();
  EXPECT_EQ(bytes, 3ULL * 2 /*blocks*/ * 3 /*layers*/ * 2 /*K,V*/ *
                       g.block_bytes(PoolTensor::kKey) * 2 /*ranks*/);
  EXPECT_EQ(finished, 6u);
  EXPECT_TRUE(j["coordinator"]["doorbell_wakes"].is_number_unsigned());
  for (const auto& w : j["workers"])
    EXPECT_TRUE(w["doorbell_wakes"].is_number_unsigned());
  EXPECT_EQ(unrung, 3u) << "of each request's two finished reports, only the last woke the "
                           "coordinator (instance/report_wake_gate.h)";
  EXPECT_EQ(j["rings"].size(), 2u + 3u * 2u);
  EXPECT_EQ(j["rings"][0]["name"], "submit");
  // Every hop of the two paths is timed, once per event, with the full set of quantiles.
  auto count = [](const nlohmann::json& block, const char* hop) {
    const auto& h = block["histograms"][hop];
    EXPECT_TRUE(h.contains("p99.9")) << hop;
    EXPECT_LE(h["p50"].get<uint64_t>(), h["max"].get<uint64_t>()) << hop;
    return h["count"].get<uint64_t>();
  };
  const auto& co = j["coordinator"];
  EXPECT_EQ(count(co, "hop_submit_to_read"), 6u) << "3 CacheTasks and 3 CacheDests";
  EXPECT_EQ(count(co, "hop_read_to_task_written"), 6u) << "a bind and a dest per request";
  EXPECT_EQ(count(co, "hop_report_written_to_read"), 6u) << "a report per rank and request";
  EXPECT_EQ(count(co, "hop_report_read_to_completion"), 3u);
  EXPECT_EQ(count(co, "tail_last_report_written_to_read"), 3u) << "the report that finished each";
  EXPECT_EQ(count(j["clients"], "hop_completion_to_engine_read"), 3u) << "the engine read all 3";
  for (const auto& w : j["workers"]) {
    EXPECT_EQ(count(w, "hop_task_written_to_read"), 6u);
    EXPECT_EQ(count(w, "hop_copy_done_to_report"), 3u);
    EXPECT_EQ(count(w, "hop_signal_written_to_read"), 9u)
        << "3 layers of 3 requests, each signal stamped by the client library (its batch "
           "records carry no stamp)";
    // Its signals race its bind (through the coordinator): a layer let go
    // by the bind has no push to be timed from.
    EXPECT_LE(count(w, "tail_last_signal_to_report"), 3u);
    // Timed only for a destination whose copy began at once: whether the
    // signals (pushed straight to the worker) beat the destination (through
    // the coordinator) is a race, but never more than once per request.
    EXPECT_LE(count(w, "hop_dest_read_to_copy"), 3u);
  }
}

// The tail of a request whose layers are signalled after its destination is
// bound: each rank times it from the push of the signal that let its last
// layer go, and the coordinator the report that finished it.
TEST_F(DumpTest, TheTailIsTimedFromTheLastLayersSignalToTheReportThatFinishedTheRequest) {
  sim::RequestBlocks r{1, {0, 1}, {0, 1}};
  env_->fill(r);
  ASSERT_TRUE(env_->submit_task("tail", r, 2 * 16, 0).ok());
  ASSERT_TRUE(env_->submit_dest("tail", r).ok());
  const Deadline bound = Deadline::after(10s);
  while (worker_counter_sum(env_->prefill().name(), "tasks") < 2 * env_->tp() && !bound.passed())
    std::this_thread::sleep_for(1ms);
  ASSERT_FALSE(bound.passed()) << "both ranks read the bind and the destination";
  env_->prefill_step(1, {{0, 0, 32, Client::request_tag("tail")}}, 3);
  ASSERT_EQ(env_->wait_for("tail").status, CompletionStatus::kFinished);
  const nlohmann::json j = dump_json(env_->prefill().name());
  ASSERT_TRUE(j.is_object());
  for (const auto& w : j["workers"])
    EXPECT_EQ(w["histograms"]["tail_last_signal_to_report"]["count"], 1) << w.dump();
  EXPECT_EQ(j["coordinator"]["histograms"]["tail_last_report_written_to_read"]["count"], 1);
  EXPECT_LE(j["coordinator"]["histograms"]["tail_last_report_written_to_read"]["max"],
            j["coordinator"]["histograms"]["hop_report_written_to_read"]["max"])
      << "the tail's report is one of the reports";
}

// An engine that writes its signal records itself may stamp them with
// anything: only a stamp from the past is timed, and none changes what the
// signal does.
TEST_F(DumpTest, ALayerSignalsStampIsTimedOnlyWhenItIsFromThePast) {
  Result<ControlSegment> control = ControlSegment::attach(env_->prefill().name());
  ASSERT_TRUE(control) << control.error().message;
  Result<SpscProducer<records::LayerSignal>> producer =
      control->signal_ring<records::LayerSignal>(0)->lease_producer();
  ASSERT_TRUE(producer) << producer.error().message;
  const uint64_t now = mono_now_ns();
  const uint64_t hour_ahead = now + uint64_t{3600} * 1000 * 1000 * 1000;
  for (const uint64_t stamp : {uint64_t{0}, hour_ahead, now - uint64_t{5'000'000}}) {
    records::LayerSignal s{};
    s.kind = static_cast<uint32_t>(records::SignalKind::kLayerDone);
    s.step = 1;
    s.layer = 0;
    s.pushed_ns = stamp;
    ASSERT_TRUE(producer->try_push(s));
  }
  notify_waiters(control->status().worker_doorbell[0]);
  nlohmann::json j;
  for (int i = 0; i < 500; ++i) {
    j = dump_json(env_->prefill().name());
    if (j.is_object() && j["workers"][0]["counters"]["signals"] == 3) break;
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(j["workers"][0]["counters"]["signals"], 3) << "rank 0 read the three signals";
  const auto& hop = j["workers"][0]["histograms"]["hop_signal_written_to_read"];
  EXPECT_EQ(hop["count"], 1) << "neither the missing stamp nor the one from the future";
  EXPECT_GE(hop["max"].get<uint64_t>(), 4'000'000u) << "the stamp 5 ms old, within the "
                                                       "histogram's resolution";
  EXPECT_EQ(j["workers"][1]["histograms"]["hop_signal_written_to_read"]["count"], 0);
}

TEST_F(DumpTest, PeekDecodesACacheTaskWaitingInTheSubmitRing) {
  kill(env_->prefill().pid(), SIGSTOP);  // the coordinator cannot consume it now
  sim::RequestBlocks r{9, {4, 5}, {6, 7}};
  ASSERT_TRUE(env_->submit_task("peek-me", r, 20, 3).ok());
  int code = -1;
  const std::string out =
      kvrelay_dump({env_->prefill().name(), "--ring", "submit", "--peek", "5"}, &code);
  kill(env_->prefill().pid(), SIGCONT);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("CacheTask: (requestId = \"peek-me\", srcBlockIds = [4, 5], needPrefillTokens "
                     "= 20, engineSlot = 3"),
            std::string::npos)
      << out;
  // The dump did not consume it: the request still completes normally.
  ASSERT_TRUE(env_->submit_dest("peek-me", r).ok());
  env_->prefill_step(1, {{3, 0, 20, Client::request_tag("peek-me")}}, 3);
  EXPECT_EQ(env_->wait_for("peek-me").status, CompletionStatus::kFinished);
}

// Whether `pid` is stopped (SIGSTOP), from /proc/PID/stat's state letter.
bool is_stopped(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T';
}

// An engine that reads a completion and then runs kvrelay-dump finds the
// request counted by every rank, however late a rank's loop would have got
// to its counters: here each worker is stopped the moment its finished
// report is in the ring, so only what it mirrored before can be seen.
TEST(DumpProcesses, AWorkersCountsAreMirroredBeforeItsReportCanFinishTheRequest) {
  InstanceArgs a;
  a.tp = 2;
  a.layers = 3;
  Placement where;
  where.prefill_prefix = {"/usr/bin/env", "KVRELAY_FAULT=worker.finished_reported=stop"};
  TwoInstances env("mirrored", a, where);
  sim::RequestBlocks r{1, {0, 1}, {0, 1}};
  env.fill(r);
  ASSERT_TRUE(env.submit_task("counted", r, 2 * 16, 0).ok());
  ASSERT_TRUE(env.submit_dest("counted", r).ok());
  env.prefill_step(1, {{0, 0, 32, Client::request_tag("counted")}}, 3);
  ASSERT_EQ(env.wait_for("counted").status, CompletionStatus::kFinished);
  const nlohmann::json j = dump_json(env.prefill().name());
  std::vector<pid_t> workers;
  for (uint32_t rank = 0; rank < env.tp(); ++rank)
    workers.push_back(static_cast<pid_t>(worker_pid(env.prefill().name(), rank)));
  for (const pid_t pid : workers)
    EXPECT_TRUE(is_stopped(pid)) << "worker " << pid << " is held just after its report";
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j["workers"].size(), 2u);
  const PoolGeometry& g = env.src_pool(0).geometry();
  for (const auto& w : j["workers"]) {
    EXPECT_EQ(w["counters"]["requests_finished"], 1) << w.dump();
    EXPECT_EQ(w["counters"]["bytes_copied"],
              2 /*blocks*/ * 3 /*layers*/ * 2 /*K,V*/ * g.block_bytes(PoolTensor::kKey));
  }
  for (const pid_t pid : workers)
    kill(pid, SIGCONT);
  env.stop_and_check_clean();
}

TEST(DumpProcesses, SegmentOfASigkilledCoordinatorShowsAsStale) {
  InstanceArgs a;
  a.instance = unique_instance("dump-stale");
  auto inst = Instance::start(a);
  const pid_t pid = inst->pid();
  inst->kill9();
  std::this_thread::sleep_for(1500ms);  // its workers notice and exit
  const std::string list = kvrelay_dump({"--list"});
  EXPECT_NE(list.find("/kvrelay-" + a.instance + " "), std::string::npos) << list;
  EXPECT_NE(list.find("stale"), std::string::npos);
  EXPECT_NE(list.find("coordinator pid " + std::to_string(pid) + " is gone"), std::string::npos)
      << list;
  int code = -1;
  const auto j = nlohmann::json::parse(kvrelay_dump({a.instance, "--json"}, &code));
  EXPECT_TRUE(j["instance"]["stale"].get<bool>());
  EXPECT_EQ(j["coordinator"]["health"], "dead");
  EXPECT_EQ(code, 3) << "a stale instance is no healthy one, for a probe";
  const std::string text = kvrelay_dump({a.instance}, &code);
  EXPECT_EQ(code, 3) << text;
  EXPECT_EQ(text.rfind("health unhealthy\n", 0), 0u) << text;
}

// --clean-stale removes what provably serves nothing, and nothing else: a
// SIGKILLed instance's control segment and pools; beside a live instance
// restarted at a smaller TP, the pool of the rank it no longer has; never a
// live instance's segments.
TEST(DumpProcesses, CleanStaleRemovesWhatProvablyServesNothingAndNothingElse) {
  auto exists = [](const std::string& segment) {
    return access(("/dev/shm/" + segment).c_str(), F_OK) == 0;
  };
  InstanceArgs dead;
  dead.instance = unique_instance("clean-dead");
  dead.tp = 2;
  auto gone = Instance::start(dead);
  gone->kill9();
  InstanceArgs shrunk = dead;
  shrunk.instance = unique_instance("clean-shrunk");
  auto first = Instance::start(shrunk);
  first->kill9();
  std::this_thread::sleep_for(1500ms);  // their workers notice and exit
  shrunk.tp = 1;
  auto again = Instance::start(shrunk);  // replaces the stale control segment; rank 1's pool stays
  const std::string dead_control = "kvrelay-" + dead.instance;
  const std::string shrunk_control = "kvrelay-" + shrunk.instance;
  ASSERT_TRUE(exists(dead_control + "-pool-r1"));
  ASSERT_TRUE(exists(shrunk_control + "-pool-r1"));

  int code = -1;
  std::string out = kvrelay_dump({"--clean-stale", shrunk.instance}, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("removed /" + shrunk_control + "-pool-r1: instance '" + shrunk.instance +
                     "' runs 1 ranks now"),
            std::string::npos)
      << out;
  EXPECT_FALSE(exists(shrunk_control + "-pool-r1"));
  EXPECT_TRUE(exists(shrunk_control)) << "live: " << out;
  EXPECT_TRUE(exists(shrunk_control + "-pool-r0")) << "live: " << out;
  EXPECT_TRUE(exists(dead_control)) << "another instance, not named: " << out;

  out = kvrelay_dump({"--clean-stale", dead.instance}, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("removed /" + dead_control + ": its coordinator is gone"), std::string::npos)
      << out;
  for (const std::string& s : {dead_control, dead_control + "-pool-r0", dead_control + "-pool-r1"})
    EXPECT_FALSE(exists(s)) << s << ": " << out;
  EXPECT_NE(out.find("removed 3 stale segments"), std::string::npos) << out;
  EXPECT_EQ(again->stop(), 0);
}

TEST(DumpProcesses, CorruptedMagicOrVersionGivesTheRightErrorNotACrash) {
  InstanceConfig c = default_config(unique_instance("dump-bad"), 1);
  auto seg = ControlSegment::create(c);
  ASSERT_TRUE(seg.ok());
  const std::string name = instance_of(c);
  seg->header().preamble.layout_version = 99;
  int code = -1;
  std::string out = kvrelay_dump({name}, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("layout version 99"), std::string::npos) << out;
  seg->header().preamble.layout_version = kLayoutVersion;
  seg->header().preamble.magic.store(0x4242);
  out = kvrelay_dump({name}, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("not a kvrelay segment"), std::string::npos) << out;
  const std::string list = kvrelay_dump({"--list"});
  EXPECT_NE(list.find("/kvrelay-" + name + " "), std::string::npos);
  EXPECT_NE(list.find("invalid"), std::string::npos) << list;
  (void)seg->unlink();
}

// The watchdog (worker/stall_watch.h): a request whose final chunk was
// signalled on every rank but whose decode half never comes is listed by
// both ranks, with what it waits for, once --stall-report-ms has passed;
// the instance reads unhealthy meanwhile, and the listing goes once the
// decode half arrives and the request finishes.
TEST(DumpProcesses, AStalledRequestIsListedPerRankWithWhatItWaitsFor) {
  InstanceArgs a;
  a.tp = 2;
  a.layers = 3;
  a.extra = {"--stall-report-ms", "300"};
  TwoInstances env("dump-stall", a);
  sim::RequestBlocks r{1, {0, 1}, {0, 1}};
  env.fill(r);
  ASSERT_TRUE(env.submit_task("late-half", r, 32, 7).ok());
  env.prefill_step(1, {{7, 0, 32, Client::request_tag("late-half")}}, 3);
  nlohmann::json j;
  const Deadline until = Deadline::after(10s);
  for (;;) {
    j = dump_json(env.prefill().name());
    ASSERT_FALSE(j.is_discarded());
    if ((j["workers"][0]["stalled"] == 1 && j["workers"][1]["stalled"] == 1) || until.passed())
      break;
    std::this_thread::sleep_for(100ms);
  }
  for (const auto& w : j["workers"]) {
    ASSERT_EQ(w["stalls"].size(), 1u) << j.dump(2);
    EXPECT_EQ(w["stalls"][0]["request_id"], "late-half");
    EXPECT_EQ(w["stalls"][0]["slot"], 7);
    EXPECT_EQ(w["stalls"][0]["reason"], "no_decode_half");
    EXPECT_GE(w["stalls"][0]["seconds"].get<double>(), 0.3);
    EXPECT_EQ(w["counters"]["stalled_requests"], 1);
  }
  EXPECT_EQ(j["health"], "unhealthy");
  int code = -1;
  const std::string text = kvrelay_dump({env.prefill().name()}, &code);
  EXPECT_EQ(code, 3) << "a stalled request makes the instance unhealthy: " << text;
  EXPECT_NE(text.find("'late-half' slot 7"), std::string::npos) << text;
  EXPECT_NE(text.find("waiting for its CacheDest"), std::string::npos) << text;

  ASSERT_TRUE(env.submit_dest("late-half", r).ok());
  EXPECT_EQ(env.wait_for("late-half").status, CompletionStatus::kFinished);
  EXPECT_EQ(env.wrong_words(r), 0u);
  const Deadline cleared = Deadline::after(10s);
  do {
    std::this_thread::sleep_for(200ms);
    j = dump_json(env.prefill().name());
  } while ((j["workers"][0]["stalled"] != 0 || j["workers"][1]["stalled"] != 0) &&
           !cleared.passed());
  EXPECT_EQ(j["workers"][0]["stalled"], 0) << j.dump(2);
  EXPECT_EQ(j["workers"][1]["stalled"], 0);
  env.stop_and_check_clean();
}

// A rank its coordinator gave up says why in the dump: its worker, killed
// while serving, is restarted, but every start after that fails the same way
// before it is ready (a stand-in for the worker that runs the real one only
// the first time), so the rank is given up and stays down.
TEST(DumpProcesses, ARankGivenUpSaysWhyItIsDown) {
  char dir[] = "/tmp/kvrelay-dump-gaveup-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string wrapper = std::string(dir) + "/worker";
  const std::string marker = std::string(dir) + "/started";
  std::ofstream(wrapper) << "#!/bin/sh\n"
                         << "[ -e " << marker << " ] && exit 1\n"
                         << "touch " << marker << "\n"
                         << "exec " << Instance::bin("kvrelay-worker") << " \"$@\"\n";
  ASSERT_EQ(chmod(wrapper.c_str(), 0700), 0);
  InstanceArgs a;
  a.instance = unique_instance("dump-gaveup");
  a.extra = {"--worker-binary", wrapper};
  auto inst = Instance::start(a);
  const uint32_t pid = worker_pid(a.instance, 0);
  ASSERT_NE(pid, 0u);
  ASSERT_EQ(kill(static_cast<pid_t>(pid), SIGKILL), 0);
  // Restarts after 100, 200, 400, 800 and 1600 ms; the fifth failed start
  // gives it up. Meanwhile the dump says it is coming back.
  std::set<std::string> reasons;
  nlohmann::json j;
  const Deadline until = Deadline::after(20s);
  do {
    std::this_thread::sleep_for(50ms);
    j = dump_json(a.instance);
    ASSERT_FALSE(j.is_discarded());
    reasons.insert(j["workers"][0]["exit_reason"].get<std::string>());
  } while (!reasons.contains("not restarted: exit code 1") && !until.passed());
  EXPECT_EQ(j["workers"][0]["exit_reason"], "not restarted: exit code 1") << j.dump(2);
  EXPECT_TRUE(reasons.contains("restarting after: exit code 1"))
      << "the 800 and 1600 ms backoffs were not seen";
  EXPECT_FALSE(j["workers"][0]["ready"].get<bool>());
  int code = -1;
  const std::string text = kvrelay_dump({a.instance}, &code);
  EXPECT_EQ(code, 3) << text;
  EXPECT_NE(text.find("rank 0 is not ready, absent (not restarted: exit code 1)"),
            std::string::npos)
      << text;
  EXPECT_EQ(inst->stop(), 0);
  unlink(marker.c_str());
  unlink(wrapper.c_str());
  rmdir(dir);
}

TEST(DumpProcesses, HelpExplainsEveryColumn) {
  const std::string out = kvrelay_dump({"--help"});
  for (const char* column : {"heartbeat", "ready flag", "full", "skipped", "parked", "generation",
                             "p50", "lanes and rdma sessions"})
    EXPECT_NE(out.find(column), std::string::npos) << column;
}

}  // namespace
}  // namespace kvrelay::testing
