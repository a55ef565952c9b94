// The answers a network connection waits for (net/answer_deadlines.h): a
// peer that keeps answering is never cut, however long its queue of answers
// and however slowly they come; one that stops answering is cut `within`
// after its last answer. Judged at chosen instants, so nothing here sleeps.
#include "worker/net/answer_deadlines.h"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>
#include <chrono>

namespace kvrelay::worker::net {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// An owner the deadlines could call back (they never do here: the timer
// never runs).
struct Owner {
  bool closed() const { return false; }
  void answer_overdue(uint64_t, const AnswerDeadlines::Due&) {}
};

class AnswerDeadlinesTest : public ::testing::Test {
 protected:
  boost::asio::io_context io_;
  AnswerDeadlines deadlines_{io_.get_executor(), milliseconds(100)};
  std::shared_ptr<Owner> owner_ = std::make_shared<Owner>();
};

TEST_F(AnswerDeadlinesTest, NothingAwaitedIsNeverOverdue) {
  EXPECT_FALSE(deadlines_.overdue_at(Clock::now() + std::chrono::hours(1)));
}

TEST_F(AnswerDeadlinesTest, TheOldestAnswerIsOverdueOnceItsWithinHasPassed) {
  const auto asked = Clock::now();
  deadlines_.expect(7, "ack", milliseconds(1000), owner_);
  deadlines_.expect(8, "ack", milliseconds(1000), owner_);
  EXPECT_FALSE(deadlines_.overdue_at(asked + milliseconds(900)));
  auto overdue = deadlines_.overdue_at(Clock::now() + milliseconds(1001));
  ASSERT_TRUE(overdue);
  EXPECT_EQ(overdue->first, 7U) << "the oldest is judged first";
  EXPECT_STREQ(overdue->second.what, "ack");
  EXPECT_EQ(overdue->second.within, milliseconds(1000));
}

// A queue of answers behind a slow one: a later answer with a short allowance
// is not judged while an older one is still awaited (the peer answers in
// order, so it cannot answer it first).
TEST_F(AnswerDeadlinesTest, AnAnswerQueuedBehindAnotherIsNotJudgedBeforeIt) {
  deadlines_.expect(1, "ack", milliseconds(5000), owner_);   // a large transfer
  deadlines_.expect(2, "ack", milliseconds(100), owner_);    // a small one behind it
  EXPECT_FALSE(deadlines_.overdue_at(Clock::now() + milliseconds(4000)));
}

// Every answer restarts the clock of the next: a backlog far longer than any
// one allowance passes, answer by answer, as long as each comes in time.
TEST_F(AnswerDeadlinesTest, APeerThatKeepsAnsweringIsNeverCutHoweverLongItsBacklog) {
  const auto t0 = Clock::now();
  for (uint64_t id = 1; id <= 50; ++id)
    deadlines_.expect(id, "ack", milliseconds(1000), owner_, t0);
  for (uint64_t id = 1; id < 50; ++id) {
    const auto answer = t0 + milliseconds(900) * id;  // 45 s for the backlog in all
    deadlines_.answered(id, answer);
    EXPECT_FALSE(deadlines_.overdue_at(answer + milliseconds(990))) << "after answer " << id;
  }
  const auto last = t0 + milliseconds(900) * 49;
  auto overdue = deadlines_.overdue_at(last + milliseconds(1010));
  ASSERT_TRUE(overdue) << "a peer that stops answering is cut one allowance after its last answer";
  EXPECT_EQ(overdue->first, 50U);
}

TEST_F(AnswerDeadlinesTest, AnAnswerForSomethingNotAwaitedIsNotProgress) {
  const auto asked = Clock::now();
  deadlines_.expect(1, "grant", milliseconds(1000), owner_);
  deadlines_.answered(99);  // nothing awaited it
  auto overdue = deadlines_.overdue_at(asked + milliseconds(1001));
  ASSERT_TRUE(overdue);
  EXPECT_STREQ(overdue->second.what, "grant");
}

TEST_F(AnswerDeadlinesTest, ClearForgetsEverythingAwaited) {
  deadlines_.expect(1, "ack", milliseconds(10), owner_);
  deadlines_.clear();
  EXPECT_FALSE(deadlines_.overdue_at(Clock::now() + std::chrono::hours(1)));
}

}  // namespace
}  // namespace kvrelay::worker::net
