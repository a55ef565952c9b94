// A rank's report outbox on a real report ring: reports reach the
// coordinator's side in order, a full ring holds them back (counted) instead
// of dropping one, and the next flush sends them, ahead of newer ones. Of a
// request's finished reports only the last wakes the coordinator.
#include "worker/report_outbox.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <vector>

#include "instance/control_segment.h"
#include "support/test_segment.h"

namespace kvrelay::worker {
namespace {

constexpr uint32_t kDelayed = 3;
constexpr uint32_t kWithoutWake = 4;

class ReportOutboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InstanceConfig config = testing::test_config(2);
    config.report_ring_records = 8;
    control_ = testing::create_test_segment(config);
    ASSERT_TRUE(control_);
    ring_ = std::make_unique<SpscRing<records::WorkerReport>>(
        control_->report_ring<records::WorkerReport>(1).value());
    outbox_ = std::make_unique<ReportOutbox>(ring_->lease_producer().value(), 1,
                                             control_->status().coordinator_doorbell,
                                             gates(), counters(), kDelayed, kWithoutWake);
  }
  ReportWakeGates& gates() { return control_->status().finished_report_gates; }
  WaitEvent& doorbell() { return control_->status().coordinator_doorbell; }
  // Wake calls the report made, with the coordinator taken to be parked (the
  // doorbell counts a waiter, so every notify is a FUTEX_WAKE, counted).
  uint64_t wakes_of(const std::function<void()>& report) {
    doorbell().waiters.fetch_add(1);
    const uint64_t before = doorbell().wake_calls.load();
    report();
    doorbell().waiters.fetch_sub(1);
    return doorbell().wake_calls.load() - before;
  }
  CountersBlock& counters() { return control_->counters(0); }
  std::vector<records::WorkerReport> drain() {
    std::vector<records::WorkerReport> out;
    records::WorkerReport r{};
    while (ring_->try_pop(r))
      out.push_back(r);
    return out;
  }

  testing::TestSegment control_;
  std::unique_ptr<SpscRing<records::WorkerReport>> ring_;
  std::unique_ptr<ReportOutbox> outbox_;
};

TEST_F(ReportOutboxTest, AReportGoesOutAtOnceWithItsFields) {
  outbox_->report(42, records::ReportKind::kFailed, 4096, "layer 3: peer gone", 777);
  const std::vector<records::WorkerReport> got = drain();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].handle, 42u);
  EXPECT_EQ(got[0].kind, static_cast<uint32_t>(records::ReportKind::kFailed));
  EXPECT_EQ(got[0].rank, 1u);
  EXPECT_EQ(got[0].bytes_moved, 4096u);
  EXPECT_EQ(got[0].first_copy_ns, 777u);
  EXPECT_EQ(got[0].message_text(), "layer 3: peer gone");
  EXPECT_EQ(outbox_->waiting(), 0u);
}

TEST_F(ReportOutboxTest, AFullRingHoldsReportsBackInOrderAndNoneIsLost) {
  const uint64_t n = ring_->capacity() + 5;
  for (uint64_t h = 1; h <= n; ++h)
    outbox_->report(h, records::ReportKind::kFinished, h, "");
  EXPECT_EQ(outbox_->waiting(), 5u);
  EXPECT_GT(counters().values[kDelayed].load(), 0u);
  std::vector<records::WorkerReport> got = drain();
  EXPECT_EQ(got.size(), ring_->capacity());
  outbox_->report(n + 1, records::ReportKind::kFinished, n + 1, "");  // behind the waiting ones
  outbox_->flush();
  for (const records::WorkerReport& r : drain())
    got.push_back(r);
  ASSERT_EQ(got.size(), n + 1);
  for (uint64_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i].handle, i + 1) << "reports reach the coordinator in the order decided";
  EXPECT_EQ(outbox_->waiting(), 0u);
}

TEST_F(ReportOutboxTest, OnlyTheLastRankToFinishWakesTheCoordinator) {
  report_wake_gate::arm(gates(), 7, 3);
  using records::ReportKind;
  EXPECT_EQ(wakes_of([&] { outbox_->report(7, ReportKind::kFinished, 1, ""); }), 0u);
  EXPECT_EQ(wakes_of([&] { outbox_->report(7, ReportKind::kFinished, 1, ""); }), 0u);
  EXPECT_EQ(wakes_of([&] { outbox_->report(7, ReportKind::kFinished, 1, ""); }), 1u)
      << "the third of three ranks is the last: it wakes the coordinator";
  EXPECT_EQ(counters().values[kWithoutWake].load(), 2u);
  EXPECT_EQ(drain().size(), 3u) << "the unrung reports are in the ring all the same";
}

TEST_F(ReportOutboxTest, FailuresAndUnknownRequestsAlwaysWake) {
  using records::ReportKind;
  report_wake_gate::arm(gates(), 8, 2);
  EXPECT_EQ(wakes_of([&] { outbox_->report(8, ReportKind::kFailed, 0, "peer gone"); }), 1u)
      << "a failure is never held back";
  EXPECT_EQ(wakes_of([&] { outbox_->report(8, ReportKind::kFinished, 1, ""); }), 1u)
      << "the failure counted itself: the other rank's answer is the last one";
  report_wake_gate::arm(gates(), 9, 2);
  EXPECT_EQ(wakes_of([&] { outbox_->report(9, ReportKind::kCancelled, 0, ""); }), 1u);
  EXPECT_EQ(wakes_of([&] { outbox_->report(9 + kReportWakeGates, ReportKind::kFinished, 1, ""); }),
            1u)
      << "a gate armed for another request wakes";
  EXPECT_EQ(wakes_of([&] { outbox_->report(10, ReportKind::kConnected, 0, ""); }), 1u);
  EXPECT_EQ(counters().values[kWithoutWake].load(), 0u);
}

TEST_F(ReportOutboxTest, AReportThatWaitedForRoomWakesWhenItGoesOut) {
  using records::ReportKind;
  for (uint64_t h = 100; h < 100 + ring_->capacity(); ++h)
    outbox_->report(h, ReportKind::kConnected, 0, "");
  report_wake_gate::arm(gates(), 5, 2);
  outbox_->report(5, ReportKind::kFinished, 1, "");  // waits: the ring is full
  ASSERT_EQ(outbox_->waiting(), 1u);
  drain();
  EXPECT_EQ(wakes_of([&] { outbox_->flush(); }), 1u)
      << "it never counted itself, so a rank after it may not have woken the coordinator";
}

}  // namespace
}  // namespace kvrelay::worker
