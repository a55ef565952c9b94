// The task table in isolation: merge orders, duplicates, cancel, deadlines,
// rank loss and aggregation, with a sink that records what it was asked to
// do. The multi-process tests drive the same logic through real rings.
#include "coordinator/task_table.h"

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
};

class RecordingSink : public Sink {
 public:
  void to_worker(uint32_t rank, capnp::MessageBuilder& msg) override {
    auto w = msg.getRoot<schema::WorkerTask>().asReader();
    tasks.push_back({rank, w.getHandle(), w.getRequestId().cStr(), w.which()});
  }
  void complete(capnp::MessageBuilder& msg) override {
    auto c = msg.getRoot<schema::Completion>().asReader();
    done.push_back({c.getRequestId().cStr(), c.getStatus(), c.getErrorRank(), c.getMessage().cStr(),
                    c.getBytesMoved(), c.getFirstCopyNs()});
  }
  std::vector<SentTask> tasks;
  std::vector<Done> done;
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

  void task(const std::string& id, std::vector<uint32_t> src = {1, 2, 3},
            uint32_t deadline_ms = 0) {
    capnp::MallocMessageBuilder m;
    auto t = m.initRoot<schema::CacheTask>();
    testing::fill_cache_task(t, id, src, src.size() * 64, 0);
    t.setDeadlineMs(deadline_ms);
    table->on_cache_task(t.asReader(), now);
  }
  void dest(const std::string& id, std::vector<uint32_t> ids = {7, 8, 9}) {
    capnp::MallocMessageBuilder m;
    testing::fill_cache_dest_ipc(m.initRoot<schema::CacheDest>(), id, ids);
    table->on_cache_dest(m.getRoot<schema::CacheDest>().asReader(), now);
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

}  // namespace
}  // namespace kvrelay::coordinator
