// kvrelay-sim's idle queue: jobs run off the caller's thread at SCHED_IDLE,
// urgent ones first; a waiter runs a job itself when the thread is stuck;
// pause() holds jobs back and waits for the one in progress.
#include "idle_queue.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace kvrelay::sim {
namespace {

using namespace std::chrono_literals;

TEST(IdleQueue, RunsEveryJobOffTheCallersThreadAtIdlePriority) {
  IdleQueue q;
  std::mutex m;
  std::vector<int> order;
  std::atomic<int> policy{-1};
  std::thread::id ran_on;
  std::vector<IdleQueue::Ticket> tickets;
  for (int i = 0; i < 5; ++i)
    tickets.push_back(q.post([&, i] {
      std::lock_guard lock(m);
      order.push_back(i);
      policy = sched_getscheduler(0);
      ran_on = std::this_thread::get_id();
    }));
  for (IdleQueue::Ticket t : tickets)
    q.wait(t);
  EXPECT_TRUE(q.done(0));  // ticket 0: nothing to wait for
  for (IdleQueue::Ticket t : tickets)
    EXPECT_TRUE(q.done(t));
  std::lock_guard lock(m);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_NE(ran_on, std::this_thread::get_id());
  if (q.idle_priority()) {
    EXPECT_EQ(policy.load(), SCHED_IDLE);
  } else {
    GTEST_SKIP() << "this system refused SCHED_IDLE; the jobs ran at normal priority";
  }
}

TEST(IdleQueue, AnUrgentJobGoesAheadOfTheQueuedOnes) {
  IdleQueue q;
  q.pause();  // nothing starts until everything is queued
  std::mutex m;
  std::vector<int> order;
  auto record = [&](int i) {
    return [&, i] {
      std::lock_guard lock(m);
      order.push_back(i);
    };
  };
  q.post(record(1));
  q.post(record(2));
  q.post(record(0), /*urgent=*/true);
  q.resume();
  q.wait_all();
  std::lock_guard lock(m);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
}

TEST(IdleQueue, AWaiterRunsAQueuedJobItselfWhenTheThreadMakesNoProgress) {
  IdleQueue q(10ms);
  std::atomic<bool> release{false};
  std::atomic<bool> first_started{false};
  const IdleQueue::Ticket stuck = q.post([&] {
    first_started = true;
    while (!release)
      std::this_thread::sleep_for(1ms);
  });
  while (!first_started)
    std::this_thread::sleep_for(1ms);
  std::thread::id ran_on;
  const IdleQueue::Ticket behind = q.post([&] { ran_on = std::this_thread::get_id(); });
  q.wait(behind);  // the thread is held by `stuck`: this caller runs it
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_TRUE(q.done(behind));
  EXPECT_FALSE(q.done(stuck));  // done out of order, and said so per job
  release = true;
  q.wait(stuck);
  EXPECT_TRUE(q.done(stuck));
}

TEST(IdleQueue, PauseWaitsForTheJobInProgressAndHoldsTheRestBack) {
  IdleQueue q(10s);  // no waiter here steals
  std::atomic<bool> in_job{false};
  std::atomic<bool> job_over{false};
  q.post([&] {
    in_job = true;
    std::this_thread::sleep_for(50ms);
    job_over = true;
  });
  while (!in_job)
    std::this_thread::sleep_for(1ms);
  q.pause();
  EXPECT_TRUE(job_over);  // pause() returned only after it
  std::atomic<bool> ran{false};
  const IdleQueue::Ticket held = q.post([&] { ran = true; });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(ran);
  EXPECT_FALSE(q.done(held));
  q.resume();
  q.wait(held);
  EXPECT_TRUE(ran);
}

TEST(IdleQueue, TheDestructorRunsWhatIsStillQueuedEvenWhenPaused) {
  std::atomic<int> ran{0};
  {
    IdleQueue q;
    q.pause();
    for (int i = 0; i < 20; ++i)
      q.post([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 20);
}

}  // namespace
}  // namespace kvrelay::sim
