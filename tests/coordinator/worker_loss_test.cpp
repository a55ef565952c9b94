// Clearing what a lost worker left behind, on a real control segment: its
// task ring and signals are emptied (and counted), the barrier is poisoned,
// and the other ranks' rings keep everything.
#include "coordinator/worker_loss.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "schemas/records.h"
#include "shm/barrier.h"
#include "support/test_segment.h"

namespace kvrelay::coordinator {
namespace {

class WorkerLossTest : public ::testing::Test {
 protected:
  void SetUp() override {
    control_ = testing::create_test_segment(testing::test_config(2));
    ASSERT_TRUE(control_);
    for (uint32_t r = 0; r < 2; ++r)
      tasks_.emplace_back(control_->task_ring(r)->lease_producer().value(), nullptr);
  }
  void write_task(uint32_t rank) {
    capnp::MallocMessageBuilder msg(64);
    msg.initRoot<schema::WorkerTask>().setSessionEnded(1);
    tasks_[rank].write(schema::MessageType::WORKER_TASK, msg);
  }
  size_t tasks_readable(uint32_t rank) {
    return control_->task_ring(rank)->read([](const MpscRecord&) {});
  }

  testing::TestSegment control_;
  std::vector<RingWriter> tasks_;
};

TEST_F(WorkerLossTest, TheLostRanksTasksAndSignalsAreDroppedAndTheBarrierPoisoned) {
  for (int i = 0; i < 3; ++i) {
    write_task(0);
    write_task(1);
  }
  {
    auto signals = control_->signal_ring<records::LayerSignal>(1).value();
    auto producer = signals.lease_producer().value();
    records::LayerSignal s{};
    for (int i = 0; i < 5; ++i)
      ASSERT_TRUE(producer.try_push(s));
  }
  const uint64_t poisoned = Barrier(control_->barrier()).snapshot().rounds_poisoned;

  const LeftBehind left = clear_lost_rank(*control_, 1, tasks_[1]);
  EXPECT_TRUE(left.anything());
  EXPECT_EQ(left.queued_tasks, 0u);
  EXPECT_GT(left.ring_bytes, 0u);
  EXPECT_EQ(left.signals, 5u);
  EXPECT_EQ(Barrier(control_->barrier()).snapshot().rounds_poisoned, poisoned + 1);
  EXPECT_EQ(tasks_readable(1), 0u) << "the successor starts from nothing";
  EXPECT_EQ(tasks_readable(0), 3u) << "the other rank keeps its tasks";

  // The ring works for the successor.
  write_task(1);
  EXPECT_EQ(tasks_readable(1), 1u);
  EXPECT_FALSE(clear_lost_rank(*control_, 1, tasks_[1]).anything())
      << "a loss after everything was read leaves nothing behind";
}

}  // namespace
}  // namespace kvrelay::coordinator
