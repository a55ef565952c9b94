// kvrelay-sim's idle queue: jobs run off the caller's thread at SCHED_IDLE,
// urgent ones first; a waiter runs a job itself when the thread is stuck;
// pause() holds jobs back and waits for the one in progress.
#include "idle_queue.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace kvrelay::sim {
namespace {

using namespace std::chrono_literals;

// A long stall in the tests of order and priority: on a loaded machine the
// thread at SCHED_IDLE may wait long for a CPU, and a waiter that stole its
// jobs (after the default 20 ms) would run them on its own thread, at its
// own priority and in the order it waits for them.
constexpr std::chrono::milliseconds kNeverSteal = 120s;

TEST(IdleQueue, RunsEveryJobOffTheCallersThreadAtIdlePriority) {
  IdleQueue q(kNeverSteal);
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
    GTEST_SKIP() << "SCHED_IDLE refused, or no way back from it here (no CAP_SYS_NICE, RLIMIT_NICE "
                    "below 20): the jobs ran at normal priority";
  }
}

TEST(IdleQueue, AnUrgentJobGoesAheadOfTheQueuedOnes) {
  IdleQueue q(kNeverSteal);
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
  IdleQueue q(kNeverSteal);
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

// Burns `cpu` of this thread's own CPU time (not wall time: a starved
// thread takes far longer).
void burn_cpu(std::chrono::nanoseconds cpu) {
  auto used = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  };
  const auto until = used() + cpu;
  while (used() < until) {
  }
}

// The thread has started a job and a busy thread at normal priority shares
// its only CPU: at SCHED_IDLE (a weight of 3 against 1024) the job's 300 ms
// of CPU would take over a minute. Whoever waits for it (wait() or pause())
// raises the thread to normal priority, and it finishes in about twice its
// CPU time; the next job runs at SCHED_IDLE again.
void expect_a_started_job_finished_at_normal_priority(bool by_pause) {
  cpu_set_t one{};
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  cpu_set_t before{};
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);  // threads made from here inherit it
  std::atomic<bool> stop{false};
  std::atomic<bool> started{false};
  {
    IdleQueue q;
    std::thread busy;
    const IdleQueue::Ticket job = q.post([&] {
      started = true;
      burn_cpu(300ms);
    });
    while (!started)
      std::this_thread::sleep_for(1ms);
    busy = std::thread([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    if (by_pause) {
      q.pause();
    } else {
      q.wait(job);
    }
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_TRUE(q.done(job));
    // Read from the thread itself, not by a job: a job posted now may be
    // run by its waiter (the thread is starved again at SCHED_IDLE beside
    // the busy thread), at the waiter's priority.
    const int policy = q.thread_policy();
    q.resume();
    stop = true;
    busy.join();
    if (!q.idle_priority()) {
      sched_setaffinity(0, sizeof(before), &before);
      GTEST_SKIP() << "SCHED_IDLE refused, or no way back from it here: nothing was starved";
    }
    EXPECT_GE(q.priority_raises(), 1u);
    // Far below the minute a starved job takes, far above the ~0.6 s expected.
    EXPECT_LT(took, 20s);
    EXPECT_EQ(policy, SCHED_IDLE) << "the thread is back at SCHED_IDLE for the next job";
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(before), &before), 0);
}

TEST(IdleQueue, AWaiterFinishesAJobTheStarvedThreadStartedAtNormalPriority) {
  expect_a_started_job_finished_at_normal_priority(false);
}

TEST(IdleQueue, PauseFinishesTheStarvedThreadsJobAtNormalPriority) {
  expect_a_started_job_finished_at_normal_priority(true);
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
