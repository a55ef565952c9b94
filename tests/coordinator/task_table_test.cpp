// The task table in isolation: merge orders, duplicates, cancel, deadlines,
// rank loss and aggregation, with a sink that records what it was asked to
// do. The multi-process tests drive the same logic through real rings.
#include "coordinator/task_table.h"

#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "schemas/message_builders.h"

namespace kvrelay::coordinator {
namespace {

using records::ReportKind;
using testing::example_limits;

struct SentTask {
  uint32_t rank;
  uint64_t handle;
  std::string id;
  schema::WorkerTask::Which which;
};
struct Done {
  std::string id;
  CompletionStatus status;
  int32_t error_rank;
  std::string message;
  uint64_t bytes;
  uint64_t first_copy_ns;
  CompletionKind kind = CompletionKind::CACHE;
  bool blocks_reusable = true;
  uint32_t session = 0;
};

class RecordingSink : public Sink {
 public:
  void to_worker(uint32_t rank, capnp::MessageBuilder& msg) override {
    auto w = msg.getRoot<schema::WorkerTask>().asReader();
    tasks.push_back({rank, w.getHandle(), w.getRequestId().cStr(), w.which()});
    written_ns.push_back(w.getWrittenNs());
    if (w.isSessionEnded()) sessions_ended.push_back(w.getSessionEnded());
  }
  void observe_hop(CoordinatorHistogram hop, uint64_t ns) override { hops.emplace_back(hop, ns); }
  void expect_reports(uint64_t handle, uint32_t ranks) override {
    // (handle, ranks, tasks already sent): the gate must be armed before any.
    expected_reports.push_back({handle, ranks, tasks.size()});
  }
  struct ExpectedReports {
    uint64_t handle;
    uint32_t ranks;
    size_t tasks_before;
  };
  std::vector<ExpectedReports> expected_reports;
  std::vector<uint64_t> written_ns;  // per task sent
  std::vector<std::pair<CoordinatorHistogram, uint64_t>> hops;
  void complete(capnp::MessageBuilder& msg) override {
    auto c = msg.getRoot<schema::Completion>().asReader();
    done.push_back({c.getRequestId().cStr(), c.getStatus(), c.getErrorRank(), c.getMessage().cStr(),
                    c.getBytesMoved(), c.getFirstCopyNs(), c.getKind(), c.getBlocksReusable(),
                    c.getSession()});
    encoded_bytes.push_back(capnp::computeSerializedSizeInWords(msg) * 8);
    hops_before_completion.push_back(hops.size());
  }
  std::vector<size_t> hops_before_completion;  // per completion: hops observed by then
  std::vector<SentTask> tasks;
  std::vector<Done> done;
  std::vector<size_t> encoded_bytes;
  std::vector<uint32_t> sessions_ended;
  size_t count(schema::WorkerTask::Which which) const {
    size_t n = 0;
    for (const auto& t : tasks)
      n += t.which == which ? 1 : 0;
    return n;
  }
};

class TaskTableTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kSecond = 1'000'000'000ULL;
  RecordingSink sink;
  std::unique_ptr<TaskTable> table =
      std::make_unique<TaskTable>(example_limits(), TableOptions{}, sink);
  uint64_t now = 1000 * kSecond;

  void task(const std::string& id, std::vector<uint32_t> src = {1, 2, 3}, uint32_t deadline_ms = 0,
            uint32_t session = 0) {
    capnp::MallocMessageBuilder m;
    auto t = m.initRoot<schema::CacheTask>();
    testing::fill_cache_task(t, id, src, src.size() * 64, 0);
    t.setDeadlineMs(deadline_ms);
    table->on_cache_task(t.asReader(), now, session);
  }
  void dest(const std::string& id, std::vector<uint32_t> ids = {7, 8, 9}, uint32_t session = 0) {
    capnp::MallocMessageBuilder m;
    testing::fill_cache_dest_ipc(m.initRoot<schema::CacheDest>(), id, ids);
    table->on_cache_dest(m.getRoot<schema::CacheDest>().asReader(), now, session);
  }
  void cancel(const std::string& id) {
    capnp::MallocMessageBuilder m;
    m.initRoot<schema::Cancel>().setRequestId(id);
    table->on_cancel(m.getRoot<schema::Cancel>().asReader(), now);
  }
  void report(uint64_t handle, uint32_t rank, ReportKind kind, uint64_t bytes = 0,
              const std::string& msg = "", uint64_t first_copy_ns = 0) {
    records::WorkerReport r{};
    r.first_copy_ns = first_copy_ns;
    r.handle = handle;
    r.rank = rank;
    r.kind = static_cast<uint32_t>(kind);
    r.bytes_moved = bytes;
    r.set_message(msg);
    table->on_report(r, now);
  }
  uint64_t handle_of(const std::string& id) {
    for (const auto& t : sink.tasks)
      if (t.id == id) return t.handle;
    return 0;
  }
};

TEST_F(TaskTableTest, TaskThenDestBindsAtOnceAndSendsWhenBothAreIn) {
  task("r1");
  EXPECT_EQ(sink.count(schema::WorkerTask::BIND), 2u) << "bound on both ranks immediately";
  EXPECT_EQ(sink.count(schema::WorkerTask::DEST), 0u);
  dest("r1");
  EXPECT_EQ(sink.count(schema::WorkerTask::DEST), 2u);
  const uint64_t h = handle_of("r1");
  report(h, 0, ReportKind::kFinished, 100);
  EXPECT_TRUE(sink.done.empty()) << "rank 1 has not finished";
  report(h, 1, ReportKind::kFinished, 50);
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::FINISHED);
  EXPECT_EQ(sink.done[0].bytes, 150u);
  EXPECT_EQ(table->live(), 0u);
}

// Every dispatch to the ranks arms the finished-report gate with the number
// of ranks that will report, before the first of them can see the task
// (instance/report_wake_gate.h): an arming after a rank's report would hold
// the last report's wake-up back.
TEST_F(TaskTableTest, EveryDispatchExpectsAReportFromEachRankBeforeAnyTaskIsSent) {
  task("r1");
  dest("r1");
  const uint64_t h = handle_of("r1");
  ASSERT_EQ(sink.expected_reports.size(), 2u) << "the bind and the dest";
  for (const auto& e : sink.expected_reports) {
    EXPECT_EQ(e.handle, h);
    EXPECT_EQ(e.ranks, 2u);
  }
  EXPECT_EQ(sink.expected_reports[0].tasks_before, 0u);
  EXPECT_EQ(sink.expected_reports[1].tasks_before, 2u) << "armed again before the dests";
}

TEST_F(TaskTableTest, DispatchHopsAreTimedFromSaneStampsOnlyAndTasksCarryOneWriteTime) {
  now = mono_now_ns();
  auto submit = [&](const std::string& id, uint64_t client_ns) {
    capnp::MallocMessageBuilder m;
    auto t = m.initRoot<schema::CacheTask>();
    testing::fill_cache_task(t, id, {1, 2}, 128, 0);
    t.setClientSubmitNs(client_ns);
    table->on_cache_task(t.asReader(), now, 0);
  };
  auto submit_hops = [&] {
    std::vector<uint64_t> out;
    for (const auto& [hop, ns] : sink.hops)
      if (hop == kSubmitToReadNs) out.push_back(ns);
    return out;
  };
  submit("early", now - 5000);
  EXPECT_EQ(submit_hops(), std::vector<uint64_t>{5000});
  // A stamp from the future, or none, is another process's mistake: untimed,
  // and the request goes on.
  submit("future", now + kSecond);
  submit("none", 0);
  EXPECT_EQ(submit_hops().size(), 1u);
  ASSERT_EQ(sink.count(schema::WorkerTask::BIND), 6u) << "every request was bound on both ranks";
  // Encoded once: both ranks' copies of a task carry the same write time.
  for (size_t i = 0; i + 1 < sink.tasks.size(); i += 2) {
    EXPECT_NE(sink.written_ns[i], 0u);
    EXPECT_EQ(sink.written_ns[i], sink.written_ns[i + 1]);
    EXPECT_GE(sink.written_ns[i], now);  // an order on the monotonic clock: stamped at writing
  }
  size_t written_hops = 0;
  for (const auto& [hop, ns] : sink.hops)
    written_hops += hop == kReadToTaskWrittenNs ? 1 : 0;
  EXPECT_EQ(written_hops, 3u) << "one read -> task written per request";
}

// Every report is timed from its worker's stamp, and the one that finished
// the request is timed as the tail before the completion is written: an
// engine that reads the completion and then the histograms (a dump, a
// benchmark) must find its tail there. Stamps of 0 or from the future are
// not timed.
TEST_F(TaskTableTest, TheFinishingReportsTailIsTimedBeforeTheCompletionIsWritten) {
  auto report_stamped = [&](const std::string& id, uint32_t rank, uint64_t reported_ns) {
    records::WorkerReport r{};
    r.handle = handle_of(id);
    r.rank = rank;
    r.kind = static_cast<uint32_t>(ReportKind::kFinished);
    r.reported_ns = reported_ns;
    table->on_report(r, now);
  };
  auto count = [&](CoordinatorHistogram which, size_t upto) {
    size_t n = 0;
    for (size_t i = 0; i < upto; ++i)
      n += sink.hops[i].first == which ? 1 : 0;
    return n;
  };
  task("timed");
  dest("timed");
  task("unstamped");
  dest("unstamped");
  const size_t before = sink.hops.size();
  report_stamped("timed", 0, now - 7000);
  report_stamped("timed", 1, now - 3000);
  report_stamped("unstamped", 0, 0);
  report_stamped("unstamped", 1, now + kSecond);
  ASSERT_EQ(sink.done.size(), 2u);
  EXPECT_EQ(count(kReportWrittenToReadNs, sink.hops.size()), 2u) << "the two sane stamps";
  EXPECT_EQ(count(kLastReportWrittenToReadNs, sink.hops.size()), 1u)
      << "only the finishing report with a sane stamp";
  EXPECT_EQ(count(kLastReportWrittenToReadNs, sink.hops_before_completion[0]), 1u)
      << "the tail was observed before its completion was written";
  for (size_t i = before; i < sink.hops.size(); ++i)
    if (sink.hops[i].first == kLastReportWrittenToReadNs) {
      EXPECT_EQ(sink.hops[i].second, 3000u) << "the finishing report's own wait";
    }
}

TEST_F(TaskTableTest, CompletionCarriesTheEarliestRanksFirstCopy) {
  task("r1");
  dest("r1");
  report(handle_of("r1"), 0, ReportKind::kFinished, 10, "", 5000);
  report(handle_of("r1"), 1, ReportKind::kFinished, 10, "", 4000);
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].first_copy_ns, 4000u);
}

TEST_F(TaskTableTest, DestThenTaskWorksTheSameWay) {
  dest("r1");
  EXPECT_TRUE(sink.tasks.empty()) << "nothing to do until the prefill half arrives";
  task("r1");
  EXPECT_EQ(sink.count(schema::WorkerTask::BIND), 2u);
  EXPECT_EQ(sink.count(schema::WorkerTask::DEST), 2u);
  report(handle_of("r1"), 0, ReportKind::kFinished);
  report(handle_of("r1"), 1, ReportKind::kFinished);
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::FINISHED);
}

TEST_F(TaskTableTest, DuplicateHalfIsRejectedAndTheFirstRequestContinues) {
  task("r1");
  task("r1");
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::REJECTED);
  EXPECT_NE(sink.done[0].message.find("duplicate"), std::string::npos);
  dest("r1");
  report(handle_of("r1"), 0, ReportKind::kFinished);
  report(handle_of("r1"), 1, ReportKind::kFinished);
  ASSERT_EQ(sink.done.size(), 2u);
  EXPECT_EQ(sink.done[1].status, CompletionStatus::FINISHED);
}

TEST_F(TaskTableTest, CancelBeforeMergeEndsItAtOnceAndUnbindsTheRanks) {
  task("r1");
  cancel("r1");
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::CANCELLED);
  EXPECT_EQ(sink.count(schema::WorkerTask::CANCEL), 2u);
  dest("r1");  // the partner half, late: absorbed, no second completion
  EXPECT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(table->counters().absorbed, 1u);
}

TEST_F(TaskTableTest, CancelAfterMergeCompletesOnceEveryRankHasStopped) {
  task("r1");
  dest("r1");
  cancel("r1");
  EXPECT_EQ(sink.count(schema::WorkerTask::CANCEL), 2u);
  EXPECT_TRUE(sink.done.empty());
  report(handle_of("r1"), 0, ReportKind::kCancelled);
  report(handle_of("r1"), 1, ReportKind::kFinished);  // it was already done there
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::CANCELLED);
}

TEST_F(TaskTableTest, CancelOfAnUnknownIdIsRejected) {
  cancel("nope");
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::REJECTED);
  EXPECT_EQ(sink.done[0].message, "Cancel 'nope': no live request has this id");
}

TEST_F(TaskTableTest, DeadlineExpiryTimesOutAndWithdrawsTheWork) {
  task("r1", {1, 2, 3}, 500);
  now += 499'000'000ULL;
  table->tick(now);
  EXPECT_TRUE(sink.done.empty());
  now += 2'000'000ULL;
  table->tick(now);
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::TIMEOUT);
  EXPECT_EQ(sink.done[0].message,
            "'r1' passed its 500 ms deadline while waiting for its CacheDest");
  EXPECT_EQ(sink.count(schema::WorkerTask::CANCEL), 2u);
  report(handle_of("r1"), 0, ReportKind::kFinished);  // too late: ignored
  EXPECT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(table->counters().stray_reports, 1u);
}

TEST_F(TaskTableTest, OneFailingRankFailsTheRequestNamingTheRank) {
  task("r1");
  dest("r1");
  report(handle_of("r1"), 1, ReportKind::kFailed, 0, "block id 812 out of range");
  EXPECT_TRUE(sink.done.empty()) << "rank 0 may still be writing: the completion waits for it";
  EXPECT_EQ(sink.count(schema::WorkerTask::CANCEL), 1u) << "rank 0 is told to stop";
  report(handle_of("r1"), 0, ReportKind::kCancelled);
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::ERROR);
  EXPECT_EQ(sink.done[0].error_rank, 1);
  EXPECT_EQ(sink.done[0].message, "rank 1: block id 812 out of range");
  report(handle_of("r1"), 0, ReportKind::kFinished);
  EXPECT_EQ(sink.done.size(), 1u) << "exactly one completion";
}

TEST_F(TaskTableTest, RequestWithNoDecodeHalfYetEndsAtOnceBecauseNothingCanBeWriting) {
  task("r1");
  table->on_rank_lost(0, "killed by SIGKILL", now);
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::ERROR);
}

class RecordingSinkWithStuck : public RecordingSink {
 public:
  bool rank_unresponsive(uint32_t rank, const std::string&) override {
    stuck.push_back(rank);
    return false;  // an external worker: it cannot be stopped
  }
  std::vector<uint32_t> stuck;
};

TEST(TaskTableWithdraw, RankThatNeverConfirmsIsReportedAndTheCompletionStillComes) {
  RecordingSinkWithStuck sink;
  TaskTable table(testing::example_limits(), TableOptions{}, sink);
  uint64_t now = 1'000'000'000'000ULL;
  capnp::MallocMessageBuilder a, b, c;
  auto t = a.initRoot<schema::CacheTask>();
  testing::fill_cache_task(t, "r1", {1, 2}, 128, 0);
  t.setDeadlineMs(100);
  table.on_cache_task(t.asReader(), now);
  testing::fill_cache_dest_ipc(b.initRoot<schema::CacheDest>(), "r1", {5, 6});
  table.on_cache_dest(b.getRoot<schema::CacheDest>().asReader(), now);
  now += 101'000'000ULL;
  table.tick(now);  // the deadline passes: cancels go out, the completion waits
  EXPECT_TRUE(sink.done.empty());
  now += 1'001'000'000ULL;
  table.tick(now);  // nobody confirmed within the withdraw timeout
  EXPECT_EQ(sink.stuck, (std::vector<uint32_t>{0, 1}));
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::TIMEOUT);
  EXPECT_NE(sink.done[0].message.find("did not confirm it stopped writing in time"),
            std::string::npos);
}

TEST_F(TaskTableTest, LostRankFailsItsInFlightRequestsOnly) {
  task("a");
  dest("a");
  task("b");
  dest("b");
  report(handle_of("b"), 0, ReportKind::kFinished);
  report(handle_of("b"), 1, ReportKind::kFinished);
  table->on_rank_lost(1, "killed by SIGKILL", now);
  EXPECT_EQ(sink.done.size(), 1u) << "rank 0 has to confirm it stopped writing for 'a'";
  report(handle_of("a"), 0, ReportKind::kCancelled);
  ASSERT_EQ(sink.done.size(), 2u);
  EXPECT_EQ(sink.done[1].id, "a");
  EXPECT_EQ(sink.done[1].status, CompletionStatus::ERROR);
  EXPECT_EQ(sink.done[1].error_rank, 1);
  EXPECT_EQ(sink.done[1].message,
            "rank 1 died (killed by SIGKILL) while the request was in flight");
}

// The soak once caught this: a request sent to a rank in its restart
// backoff sat in the dead worker's ring, was withdrawn unconfirmed, and the
// replacement worker then ran it into blocks the engine had been told were
// free. While a rank is down nothing is queued for it.
TEST_F(TaskTableTest, RequestsForARankThatIsDownFailAtOnceUntilItIsRestarted) {
  table->on_rank_lost(1, "killed by SIGKILL", now);
  task("early");
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_TRUE(sink.tasks.empty()) << "nothing queued for either rank";
  EXPECT_EQ(sink.done[0].status, CompletionStatus::ERROR);
  EXPECT_EQ(sink.done[0].error_rank, 1);
  EXPECT_EQ(sink.done[0].message,
            "'early': rank 1 is down (killed by SIGKILL) and not yet restarted; nothing was "
            "started, resubmit once the instance is ready again");
  dest("early");
  EXPECT_EQ(sink.done.size(), 1u) << "its partner half is absorbed";
  EXPECT_TRUE(sink.tasks.empty());

  table->set_rank_up(1);
  task("late");
  dest("late");
  EXPECT_EQ(sink.count(schema::WorkerTask::DEST), 2u);
  report(handle_of("late"), 0, ReportKind::kFinished);
  report(handle_of("late"), 1, ReportKind::kFinished);
  ASSERT_EQ(sink.done.size(), 2u);
  EXPECT_EQ(sink.done[1].status, CompletionStatus::FINISHED);
}

TEST_F(TaskTableTest, DecodeHalfOfABoundRequestIsNotSentWhileARankIsDown) {
  task("r1");
  EXPECT_EQ(sink.count(schema::WorkerTask::BIND), 2u);
  table->on_rank_lost(1, "killed by SIGKILL", now);
  ASSERT_EQ(sink.done.size(), 1u);
  dest("r1");
  EXPECT_EQ(sink.count(schema::WorkerTask::DEST), 0u) << "the request already ended";
  EXPECT_EQ(sink.done.size(), 1u);
}

TEST_F(TaskTableTest, InvalidHalfEndsTheRequestOnceAndItsPartnerIsAbsorbed) {
  dest("r1", {7, 8, 9, 10, 11});  // longer than the source
  task("r1", {1, 2, 3});
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::ERROR);
  EXPECT_EQ(sink.done[0].message,
            "CacheDest 'r1': dest_block_ids has 5 entries but src_block_ids has 3");
  EXPECT_EQ(sink.count(schema::WorkerTask::CANCEL), 2u) << "the bound half is withdrawn";
}

TEST_F(TaskTableTest, InvalidFirstHalfGetsOneErrorAndTheLatePartnerIsAbsorbed) {
  task("r1", {1, 2, 999});
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::ERROR);
  dest("r1");
  EXPECT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(table->live(), 0u);
}

TEST_F(TaskTableTest, ConnectIsTheAndOfTheRanks) {
  capnp::MallocMessageBuilder m;
  auto c = m.initRoot<schema::ConnectTask>();
  c.setTaskId(5);
  c.setProtocol(schema::TransferProtocol::IPC);
  c.setPeerInstance("decode0");
  table->on_connect(c.asReader(), now);
  EXPECT_EQ(sink.count(schema::WorkerTask::CONNECT), 2u);
  report(handle_of("connect-5"), 0, ReportKind::kConnected);
  report(handle_of("connect-5"), 1, ReportKind::kConnectFailed, 0, "peer pool missing");
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].id, "connect-5");
  EXPECT_EQ(sink.done[0].status, CompletionStatus::ERROR);
  EXPECT_EQ(sink.done[0].error_rank, 1);
}

TEST_F(TaskTableTest, DrainingRefusesNewRequestsButFinishesLiveOnes) {
  task("live");
  table->start_draining();
  task("new");
  dest("live");
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].id, "new");
  EXPECT_NE(sink.done[0].message.find("draining"), std::string::npos);
  report(handle_of("live"), 0, ReportKind::kFinished);
  report(handle_of("live"), 1, ReportKind::kFinished);
  EXPECT_EQ(sink.done.back().status, CompletionStatus::FINISHED);
}

TEST_F(TaskTableTest, RequestIdThatCannotBeShownIsEscapedInItsRejection) {
  capnp::MallocMessageBuilder m;
  auto t = m.initRoot<schema::CacheTask>();
  testing::fill_cache_task(t, std::string("bad\x01id"), {1}, 10, 0);
  table->on_cache_task(t.asReader(), now);
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].id, "bad\\x01id");
  EXPECT_EQ(sink.done[0].status, CompletionStatus::REJECTED);
}

// ---- withdrawals: the completion says whether the blocks are free ----

class KillingSink : public RecordingSink {
 public:
  bool rank_unresponsive(uint32_t rank, const std::string&) override {
    killed.push_back(rank);
    return true;  // supervised: its death will be reported
  }
  std::vector<uint32_t> killed;
};

TEST(TaskTableWithdraw, AKilledRanksCompletionWaitsForItsExitToBeConfirmed) {
  KillingSink sink;
  TaskTable table(testing::example_limits(), TableOptions{}, sink);
  uint64_t now = 1'000'000'000'000ULL;
  capnp::MallocMessageBuilder a, b;
  auto t = a.initRoot<schema::CacheTask>();
  testing::fill_cache_task(t, "r1", {1, 2}, 128, 0);
  t.setDeadlineMs(100);
  table.on_cache_task(t.asReader(), now);
  testing::fill_cache_dest_ipc(b.initRoot<schema::CacheDest>(), "r1", {5, 6});
  table.on_cache_dest(b.getRoot<schema::CacheDest>().asReader(), now);
  records::WorkerReport confirmed{};
  confirmed.handle = sink.tasks.front().handle;
  confirmed.rank = 0;
  confirmed.kind = static_cast<uint32_t>(ReportKind::kCancelled);
  now += 101'000'000ULL;
  table.tick(now);                  // timeout: withdrawn
  table.on_report(confirmed, now);  // rank 0 confirms; rank 1 never does
  now += 1'001'000'000ULL;
  table.tick(now);
  EXPECT_EQ(sink.killed, std::vector<uint32_t>{1});
  EXPECT_TRUE(sink.done.empty()) << "not before rank 1's exit is confirmed";
  table.on_rank_lost(1, "killed by SIGKILL", now);
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::TIMEOUT);
  EXPECT_TRUE(sink.done[0].blocks_reusable) << "a dead rank writes nothing more";
}

TEST(TaskTableWithdraw, ARankThatCannotBeStoppedLeavesTheBlocksNotReusable) {
  RecordingSinkWithStuck sink;  // an external worker: cannot be killed
  TaskTable table(testing::example_limits(), TableOptions{}, sink);
  uint64_t now = 1'000'000'000'000ULL;
  capnp::MallocMessageBuilder a, b;
  auto t = a.initRoot<schema::CacheTask>();
  testing::fill_cache_task(t, "r1", {1, 2}, 128, 0);
  t.setDeadlineMs(100);
  table.on_cache_task(t.asReader(), now);
  testing::fill_cache_dest_ipc(b.initRoot<schema::CacheDest>(), "r1", {5, 6});
  table.on_cache_dest(b.getRoot<schema::CacheDest>().asReader(), now);
  now += 101'000'000ULL;
  table.tick(now);
  now += 1'001'000'000ULL;
  table.tick(now);
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_FALSE(sink.done[0].blocks_reusable);
}

TEST_F(TaskTableTest, FinishedAndNeverDispatchedRequestsLeaveTheirBlocksReusable) {
  task("r1");
  dest("r1");
  report(handle_of("r1"), 0, ReportKind::kFinished);
  report(handle_of("r1"), 1, ReportKind::kFinished);
  task("r2");
  cancel("r2");
  ASSERT_EQ(sink.done.size(), 2u);
  EXPECT_TRUE(sink.done[0].blocks_reusable);
  EXPECT_TRUE(sink.done[1].blocks_reusable);
}

// ---- exactly one completion, always ----

TEST_F(TaskTableTest, AHugeErrorMessageIsCappedAndTheCompletionStillFitsItsRing) {
  capnp::MallocMessageBuilder m;
  auto d = m.initRoot<schema::CacheDest>();
  d.setRequestId("r1");
  d.setErrorMessage(std::string(130'700, 'e'));
  table->on_cache_dest(d.asReader(), now);
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::ERROR);
  EXPECT_LE(sink.done[0].message.size(), kMaxCompletionMessageBytes + 64);
  EXPECT_NE(sink.done[0].message.find("more bytes]"), std::string::npos) << "marked as cut";
  // The smallest completion ring allowed holds it.
  EXPECT_LE(sink.encoded_bytes[0], kMinCompletionRingBytes / 8 - 8);
}

TEST_F(TaskTableTest, NonPrintableTextFromTheEngineIsEscapedInTheCompletion) {
  capnp::MallocMessageBuilder m;
  auto d = m.initRoot<schema::CacheDest>();
  d.setRequestId("r1");
  d.setErrorMessage(std::string("no room\n\xff"));
  table->on_cache_dest(d.asReader(), now);
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_NE(sink.done[0].message.find("no room\\x0a\\xff"), std::string::npos)
      << sink.done[0].message;
}

// Tombstones expire by time, not by count: a late partner half after more
// than 100,000 other completions (the old count limit, about a second at the
// target rate) is still absorbed, not started as a second request.
TEST_F(TaskTableTest, ALatePartnerHalfIsAbsorbedEvenAfterManyOtherCompletions) {
  task("early");
  cancel("early");
  ASSERT_EQ(sink.done.size(), 1u);
  for (int i = 0; i < 120'000; ++i) {
    capnp::MallocMessageBuilder m;
    m.initRoot<schema::Cancel>().setRequestId("x" + std::to_string(i));
    table->on_cancel(m.getRoot<schema::Cancel>().asReader(), now);  // rejected: unknown
    task("t" + std::to_string(i), {1});
    cancel("t" + std::to_string(i));
  }
  const size_t before = sink.done.size();
  sink.tasks.clear();
  dest("early");
  EXPECT_EQ(sink.done.size(), before) << "absorbed: no second completion";
  EXPECT_TRUE(sink.tasks.empty()) << "and nothing bound or sent for it";
  EXPECT_EQ(table->live(), 0u);
  // Long after every deadline and margin, the id may be used again.
  now += 200'000'000'000ULL;
  table->tick(now);
  task("early");
  EXPECT_EQ(table->live(), 1u);
}

TEST(TaskTableLimits, WhenTheRememberedIdsAreFullNewRequestsAreRefusedNotForgottenEarly) {
  RecordingSink sink;
  TableOptions o;
  o.max_tombstones = 100;
  TaskTable table(testing::example_limits(), o, sink);
  uint64_t now = 1'000'000'000'000ULL;
  int refused = 0;
  for (int i = 0; i < 200; ++i) {
    capnp::MallocMessageBuilder m;
    auto t = m.initRoot<schema::CacheTask>();
    testing::fill_cache_task(t, "t" + std::to_string(i), {1}, 64, 0);
    table.on_cache_task(t.asReader(), now);
    capnp::MallocMessageBuilder c;
    c.initRoot<schema::Cancel>().setRequestId("t" + std::to_string(i));
    table.on_cancel(c.getRoot<schema::Cancel>().asReader(), now);
  }
  for (const Done& d : sink.done)
    if (d.message.find("remembers") != std::string::npos) ++refused;
  EXPECT_GT(refused, 0) << "refused with a clear message";
  EXPECT_LE(table.remembered(), 100u);
  // Every id that was admitted is still remembered.
  capnp::MallocMessageBuilder m;
  testing::fill_cache_dest_ipc(m.initRoot<schema::CacheDest>(), "t0", {5});
  const size_t before = sink.done.size();
  table.on_cache_dest(m.getRoot<schema::CacheDest>().asReader(), now);
  EXPECT_EQ(sink.done.size(), before) << "t0's partner is absorbed";
}

TEST(TaskTableLimits, RequestsInFlightAreBounded) {
  RecordingSink sink;
  TableOptions o;
  o.max_live_requests = 10;
  TaskTable table(testing::example_limits(), o, sink);
  for (int i = 0; i < 12; ++i) {
    capnp::MallocMessageBuilder m;
    auto t = m.initRoot<schema::CacheTask>();
    testing::fill_cache_task(t, "t" + std::to_string(i), {1}, 64, 0);
    table.on_cache_task(t.asReader(), 1'000'000'000ULL);
  }
  EXPECT_EQ(table.live(), 10u);
  ASSERT_EQ(sink.done.size(), 2u);
  EXPECT_NE(sink.done[0].message.find("requests are in flight"), std::string::npos);
}

// ---- destinations ----

class PeerTable : public ::testing::Test {
 protected:
  RecordingSink sink;
  std::optional<PeerInfo> peer = PeerInfo{512, 2, Role::kDecode};
  int next_id = 0;
  std::unique_ptr<TaskTable> table = [this] {
    TableOptions o;
    o.own_instance = "prefill0";
    o.peer_info = [this](std::string_view) { return peer; };
    return std::make_unique<TaskTable>(testing::example_limits(), o, sink);
  }();
  std::string refuse(const std::string& peer_name, std::vector<uint32_t> devices) {
    capnp::MallocMessageBuilder m;
    auto d = m.initRoot<schema::CacheDest>();
    testing::fill_cache_dest_ipc(d, "r-" + std::to_string(next_id++), {5, 6});
    d.setPeerInstance(peer_name);
    auto list = d.initDeviceIds(static_cast<unsigned>(devices.size()));
    for (unsigned i = 0; i < devices.size(); ++i)
      list.set(i, devices[i]);
    const size_t before = sink.done.size();
    table->on_cache_dest(d.asReader(), 1'000'000'000ULL);
    return sink.done.size() > before ? sink.done.back().message : "";
  }
};

TEST_F(PeerTable, DeviceIdsMustNameDistinctRanksOfTheDecodeInstance) {
  EXPECT_EQ(refuse("decode0", {0, 1}), "");
  EXPECT_EQ(refuse("decode0", {1, 0}), "") << "a permutation is fine";
  EXPECT_NE(refuse("decode0", {0, 0}).find("names decode rank 0 twice"), std::string::npos);
  EXPECT_NE(refuse("decode0", {0, 5}).find("device_ids[1] = 5 is out of range"), std::string::npos);
}

TEST_F(PeerTable, OnlyAnotherDecodeInstanceMayBeADestination) {
  EXPECT_NE(refuse("prefill0", {0, 1}).find("is this instance itself"), std::string::npos);
  peer = PeerInfo{512, 2, Role::kPrefill};
  EXPECT_NE(refuse("prefill1", {0, 1}).find("has role prefill; only a decode instance"),
            std::string::npos);
}

TEST_F(TaskTableTest, ARefusedCancelHasTheCancelKind) {
  cancel("nobody");
  ASSERT_EQ(sink.done.size(), 1u);
  EXPECT_EQ(sink.done[0].status, CompletionStatus::REJECTED);
  EXPECT_EQ(sink.done[0].kind, CompletionKind::CANCEL);
}

// ---- engine sessions ----

TEST_F(TaskTableTest, ASessionThatDiedHasItsRequestsWithdrawnSilentlyAndItsIdsFreed) {
  const uint32_t dead = records::session_id(2, 5);
  const uint32_t alive = records::session_id(3, 1);
  task("a", {1, 2, 3}, 0, dead);
  dest("a", {7, 8, 9}, dead);
  task("b", {4}, 0, alive);
  dest("b", {10}, alive);
  sink.tasks.clear();
  table->on_session_ended(dead, now);
  EXPECT_EQ(sink.count(schema::WorkerTask::CANCEL), 2u) << "withdrawn from both ranks";
  EXPECT_EQ(table->counters().session_withdrawals, 1u);
  // The next engine reuses the id at once.
  task("a", {1, 2, 3}, 0, records::session_id(2, 6));
  EXPECT_EQ(sink.count(schema::WorkerTask::BIND), 2u) << "a new request, not a duplicate";
  // The old one's confirmations settle it without a completion.
  const uint64_t old_handle = sink.tasks.front().handle;
  report(old_handle, 0, ReportKind::kCancelled);
  report(old_handle, 1, ReportKind::kCancelled);
  EXPECT_TRUE(sink.done.empty()) << "nobody is left to read it";
  EXPECT_TRUE(table->session_has_requests(alive));
  EXPECT_EQ(table->live(), 2u) << "b and the new a";
}

}  // namespace
}  // namespace kvrelay::coordinator
