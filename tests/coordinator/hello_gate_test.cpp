// The hello gate over real task rings: it opens only once every live worker
// has read what was written before it, ignores ranks that are down, waits
// for a backlog to reach the ring, and takes its positions afresh when more
// is written that the hello must follow.
#include "coordinator/hello_gate.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "instance/control_segment.h"
#include "support/test_segment.h"

namespace kvrelay::coordinator {
namespace {

class HelloGateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    control_ = testing::create_test_segment(testing::test_config(2));
    ASSERT_TRUE(control_);
    for (uint32_t r = 0; r < 2; ++r) {
      tasks_.emplace_back(control_->task_ring(r)->lease_producer().value(), nullptr);
      readers_.push_back(control_->task_ring(r).value());
    }
  }
  void write(uint32_t rank) {
    capnp::MallocMessageBuilder msg(64);
    msg.initRoot<schema::WorkerTask>().setSessionEnded(7);
    tasks_[rank].write(schema::MessageType::WORKER_TASK, msg);
  }
  size_t worker_reads(uint32_t rank) {
    return readers_[rank].read([](const MpscRecord&) {});
  }
  bool open() {
    return gate_.open(tasks_, [this](uint32_t r) { return up_[r]; });
  }

  testing::TestSegment control_;
  std::vector<RingWriter> tasks_;
  std::vector<MpscRing> readers_;
  bool up_[2] = {true, true};
  HelloGate gate_;
};

TEST_F(HelloGateTest, OpensAtOnceWhenNothingWasWritten) {
  EXPECT_TRUE(open());
}

TEST_F(HelloGateTest, WaitsUntilEveryLiveWorkerReadWhatCameBefore) {
  write(0);
  write(1);
  EXPECT_FALSE(open());
  EXPECT_EQ(worker_reads(0), 1u);
  EXPECT_FALSE(open()) << "rank 1 has not read its withdrawal yet";
  EXPECT_EQ(worker_reads(1), 1u);
  EXPECT_TRUE(open());
}

TEST_F(HelloGateTest, ARankThatIsDownIsNotWaitedFor) {
  write(0);
  write(1);
  EXPECT_EQ(worker_reads(0), 1u);
  up_[1] = false;
  EXPECT_TRUE(open());
}

TEST_F(HelloGateTest, WhatIsWrittenAfterThePositionsWereTakenIsNotWaitedForUnlessRetargeted) {
  write(0);
  EXPECT_FALSE(open());  // takes rank 0's position after one record
  write(0);              // e.g. a new request's task: the hello need not follow it
  EXPECT_EQ(worker_reads(0), 2u);
  EXPECT_TRUE(open());

  write(1);
  EXPECT_FALSE(open());
  write(1);
  gate_.retarget();  // a dead session's withdrawal: the hello must follow this one too
  ASSERT_EQ(readers_[1].read([](const MpscRecord&) {}, 1), 1u);
  EXPECT_FALSE(open()) << "the second record is not read yet";
  EXPECT_EQ(worker_reads(1), 1u);
  EXPECT_TRUE(open());
}

}  // namespace
}  // namespace kvrelay::coordinator
