// The coordinator's guard over shared state others can overwrite, on a real
// control segment of this process: a scribbled state word and liveness slot
// are put back and counted, a ring's repairs are counted once, and a submit
// ring whose records cannot be trusted makes the instance broken.
#include "coordinator/shared_state_guard.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "coordinator/coordinator_counters.h"
#include "shm/liveness.h"
#include "support/processes.h"

namespace kvrelay::coordinator {
namespace {

constexpr uint64_t kMs = 1'000'000;

class SharedStateGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name = testing::current_test_instance();
    Result<ControlSegment> c = ControlSegment::create(default_config(name, 1));
    ASSERT_TRUE(c) << c.error().message;
    control_ = std::make_unique<ControlSegment>(std::move(c).value());
    submit_ = std::make_unique<MpscRing>(control_->submit_ring().value());
    completions_ = std::make_unique<RingWriter>(
        control_->completion_ring()->lease_producer().value(), nullptr);
    tasks_.emplace_back(control_->task_ring(0)->lease_producer().value(), nullptr);
    reports_.push_back(control_->report_ring<records::WorkerReport>(0).value());
    register_self(control_->coordinator_slot(), SlotState::kReady);
    control_->set_state(InstanceState::kReady);
    guard_ = std::make_unique<SharedStateGuard>(*control_, counters());
  }
  void TearDown() override {
    if (control_) (void)control_->unlink();
  }
  CountersBlock& counters() { return control_->counters(kCoordinatorCounters); }
  uint64_t repairs() { return counters().values[kSharedStateRepairs].load(); }
  std::optional<std::string> check(uint64_t now_ns) {
    return guard_->check(now_ns, InstanceState::kReady,
                         CoordinatorRings{*submit_, *completions_, tasks_, reports_});
  }

  std::unique_ptr<ControlSegment> control_;
  std::unique_ptr<MpscRing> submit_;
  std::unique_ptr<RingWriter> completions_;
  std::vector<RingWriter> tasks_;
  std::vector<SpscRing<records::WorkerReport>> reports_;
  std::unique_ptr<SharedStateGuard> guard_;
};

TEST_F(SharedStateGuardTest, NothingOverwrittenNothingRepaired) {
  EXPECT_FALSE(check(1 * kMs));
  EXPECT_EQ(repairs(), 0u);
}

TEST_F(SharedStateGuardTest, AnOverwrittenStateWordIsPutBackAndCountedOnce) {
  control_->header().state.store(static_cast<uint32_t>(InstanceState::kDead));
  EXPECT_FALSE(check(1 * kMs));
  EXPECT_EQ(control_->state(), InstanceState::kReady);
  EXPECT_EQ(repairs(), 1u);
  EXPECT_FALSE(check(20 * kMs));
  EXPECT_EQ(repairs(), 1u) << "nothing more to repair";
}

TEST_F(SharedStateGuardTest, AnOverwrittenLivenessSlotIsPutBack) {
  set_state(control_->coordinator_slot(), SlotState::kExiting);
  EXPECT_FALSE(check(1 * kMs));
  EXPECT_EQ(read_slot(control_->coordinator_slot()).state, SlotState::kReady);
  EXPECT_EQ(repairs(), 1u);
}

TEST_F(SharedStateGuardTest, ItLooksAtMostEveryTenMilliseconds) {
  EXPECT_FALSE(check(100 * kMs));
  control_->header().state.store(static_cast<uint32_t>(InstanceState::kDead));
  EXPECT_FALSE(check(105 * kMs));
  EXPECT_EQ(repairs(), 0u) << "not yet";
  EXPECT_FALSE(check(111 * kMs));
  EXPECT_EQ(repairs(), 1u);
}

TEST_F(SharedStateGuardTest, ASubmitRingThatLostItsRecordBoundariesBreaksTheInstance) {
  // A record header with an impossible length, where the next record starts.
  auto* h = const_cast<MpscRingHeader*>(&submit_->header());
  h->tail.store(64);
  auto* buffer = reinterpret_cast<std::atomic<uint64_t>*>(reinterpret_cast<std::byte*>(h) +
                                                          sizeof(MpscRingHeader));
  buffer[0].store(mpsc_header::pack(0x7fffff00, 1, 0, 0));
  (void)submit_->read([](const MpscRecord&) {});
  const std::optional<std::string> broken = check(1 * kMs);
  ASSERT_TRUE(broken) << "a corrupt submit ring cannot be served";
  EXPECT_NE(broken->find("submit ring"), std::string::npos) << *broken;
}

}  // namespace
}  // namespace kvrelay::coordinator
