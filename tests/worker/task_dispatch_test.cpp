// The worker's task dispatch over a real data plane (a control segment of
// this process): what must be answered at once is reported through the
// outbox with a reason, a refused RegisterPool leaves the data plane
// serving, Shutdown asks the loop to exit, and a Bind applies every pending
// signal first.
#include "worker/task_dispatch.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "instance/control_segment.h"
#include "instance/pool_segment.h"
#include "support/test_segment.h"

namespace kvrelay::worker {
namespace {

class TaskDispatchTest : public ::testing::Test {
 protected:
  void open(uint32_t host_blocks, bool engine_pools = false) {
    InstanceConfig config = testing::test_config(1);
    config.num_layers = 2;
    config.num_blocks = 16;
    config.block_size = 4;
    config.head_dim = 8;
    config.host_blocks = host_blocks;
    config.engine_pools = engine_pools ? 1 : 0;
    control_ = testing::create_test_segment(config);
    ASSERT_TRUE(control_);
    Result<std::unique_ptr<DataPlane>> d =
        DataPlane::open(*control_, 0, NetworkOptions{}, doorbell_, {});
    ASSERT_TRUE(d) << d.error().message;
    data_ = std::move(d).value();
    ring_ = std::make_unique<SpscRing<records::WorkerReport>>(
        control_->report_ring<records::WorkerReport>(0).value());
    outbox_ = std::make_unique<ReportOutbox>(ring_->lease_producer().value(), 0,
                                             control_->status().coordinator_doorbell,
                                             control_->status().finished_report_gates,
                                             control_->counters(0), 0, 1);
  }
  TaskEffect dispatch(capnp::MallocMessageBuilder& msg) {
    return dispatch_task(msg.getRoot<schema::WorkerTask>().asReader(), 0, *data_, *outbox_,
                         [this] { return pending_signals_ > 0 && pending_signals_-- > 0; });
  }
  std::vector<records::WorkerReport> reports() {
    std::vector<records::WorkerReport> out;
    records::WorkerReport r{};
    while (ring_->try_pop(r))
      out.push_back(r);
    return out;
  }

  testing::TestSegment control_;  // first: it goes last
  WaitEvent doorbell_{};
  std::unique_ptr<DataPlane> data_;
  std::unique_ptr<SpscRing<records::WorkerReport>> ring_;
  std::unique_ptr<ReportOutbox> outbox_;
  int pending_signals_ = 0;
};

TEST_F(TaskDispatchTest, ShutdownAsksTheLoopToExitAndReportsNothing) {
  open(0);
  capnp::MallocMessageBuilder msg;
  msg.initRoot<schema::WorkerTask>().setShutdown();
  const TaskEffect e = dispatch(msg);
  EXPECT_TRUE(e.shutdown);
  EXPECT_FALSE(e.broken);
  EXPECT_TRUE(reports().empty());
}

TEST_F(TaskDispatchTest, ASwapWithoutAHostTierFailsAtOnceSayingWhy) {
  open(0);
  capnp::MallocMessageBuilder msg;
  auto w = msg.initRoot<schema::WorkerTask>();
  w.setHandle(7);
  w.initSwap().setRequestId("s");
  EXPECT_FALSE(dispatch(msg).shutdown);
  const std::vector<records::WorkerReport> got = reports();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].handle, 7u);
  EXPECT_EQ(got[0].kind, static_cast<uint32_t>(records::ReportKind::kFailed));
  EXPECT_NE(got[0].message_text().find("no host tier"), std::string_view::npos);
}

TEST_F(TaskDispatchTest, AnExpectOnARankThatIsNotDecodeIsRefusedNamingTheRank) {
  open(0);
  capnp::MallocMessageBuilder msg;
  auto w = msg.initRoot<schema::WorkerTask>();
  w.setHandle(9);
  w.initExpect().setRequestId("e");
  (void)dispatch(msg);
  const std::vector<records::WorkerReport> got = reports();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].kind, static_cast<uint32_t>(records::ReportKind::kFailed));
  EXPECT_NE(got[0].message_text().find("not a decode rank"), std::string_view::npos);
}

// --pool none before the engine registered a pool: each request is answered
// once, saying why, and nothing else is touched.
TEST_F(TaskDispatchTest, WithoutAPoolEveryRequestFailsOnceSayingWhy) {
  open(8, /*engine_pools=*/true);
  ASSERT_FALSE(data_->serving());
  auto task = [&](uint64_t handle, auto init) {
    capnp::MallocMessageBuilder msg;
    auto w = msg.initRoot<schema::WorkerTask>();
    w.setHandle(handle);
    init(w);
    EXPECT_FALSE(dispatch(msg).shutdown);
    return reports();
  };
  using Kind = records::ReportKind;
  auto one = [](const std::vector<records::WorkerReport>& got, uint64_t handle, Kind kind) {
    ASSERT_EQ(got.size(), 1u) << "handle " << handle;
    EXPECT_EQ(got[0].handle, handle);
    EXPECT_EQ(got[0].kind, static_cast<uint32_t>(kind));
    if (kind != Kind::kCancelled) {
      EXPECT_NE(got[0].message_text().find("--pool none"), std::string_view::npos)
          << got[0].message_text();
    }
  };
  one(task(1, [](auto w) { w.initBind().setRequestId("b"); }), 1, Kind::kFailed);
  EXPECT_TRUE(task(1, [](auto w) { w.initDest().setRequestId("b"); }).empty())
      << "its first half already answered for it";
  one(task(2, [](auto w) { w.initExpect().setRequestId("e"); }), 2, Kind::kFailed);
  one(task(3, [](auto w) { w.initSwap().setRequestId("s"); }), 3, Kind::kFailed);
  one(task(4, [](auto w) { w.initConnect(); }), 4, Kind::kConnectFailed);
  one(task(5, [](auto w) { w.setCancel(); }), 5, Kind::kCancelled);
  capnp::MallocMessageBuilder stop;
  stop.initRoot<schema::WorkerTask>().setShutdown();
  EXPECT_TRUE(dispatch(stop).shutdown);
  EXPECT_TRUE(reports().empty());
}

TEST_F(TaskDispatchTest, AConnectIsAnsweredWithItsResult) {
  open(0);
  capnp::MallocMessageBuilder msg;
  auto w = msg.initRoot<schema::WorkerTask>();
  w.setHandle(11);
  w.initConnect().setProtocol(schema::TransferProtocol::RDMA);
  (void)dispatch(msg);
  const std::vector<records::WorkerReport> got = reports();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].kind, static_cast<uint32_t>(records::ReportKind::kConnectFailed));
  EXPECT_NE(got[0].message_text().find("rdma"), std::string_view::npos);
}

TEST_F(TaskDispatchTest, ARefusedRegisterPoolIsReportedAndLeavesTheDataPlaneServing) {
  open(8);
  const LocalPool* before = data_->device_pool();
  capnp::MallocMessageBuilder msg;
  auto w = msg.initRoot<schema::WorkerTask>();
  w.setHandle(13);
  auto d = w.initRegisterPool();
  d.setLocation(schema::PoolDescriptor::Location::HOST_SEGMENT);
  d.setTier(schema::PoolDescriptor::Tier::DEVICE);
  d.setSegmentName("kvrelay-no-such-pool-segment");
  const TaskEffect e = dispatch(msg);
  EXPECT_FALSE(e.broken);
  const std::vector<records::WorkerReport> got = reports();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].kind, static_cast<uint32_t>(records::ReportKind::kPoolRejected));
  EXPECT_FALSE(got[0].message_text().empty());
  EXPECT_EQ(data_->device_pool(), before);
  EXPECT_NE(data_->swap(), nullptr);
}

TEST_F(TaskDispatchTest, ABindAppliesEveryPendingSignalFirst) {
  open(0);
  pending_signals_ = 3;
  capnp::MallocMessageBuilder msg;
  auto w = msg.initRoot<schema::WorkerTask>();
  w.setHandle(15);
  auto b = w.initBind();
  b.setRequestId("b");
  b.setNeedPrefillTokens(4);
  b.initSrcBlockIds(1).set(0, 1);
  (void)dispatch(msg);
  EXPECT_EQ(pending_signals_, 0) << "the signal ring was drained before the bind";
  EXPECT_EQ(data_->scheduler().live_requests(), 1u);
  EXPECT_TRUE(reports().empty());
}

}  // namespace
}  // namespace kvrelay::worker
