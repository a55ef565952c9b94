// Work that must not compete with what is being measured: one thread at
// SCHED_IDLE, which the kernel runs only on a CPU nobody else wants, taking
// jobs in the order they were posted.
//
// kvrelay-sim's own bookkeeping (poisoning freed blocks, checking every byte
// of a finished request, checking that a new request's destination blocks
// were not written while free) reads or writes tens of MiB per request. On
// the engine's thread it ran inside the very windows the overlap benchmark
// times (the previous request's last layer to its completion and `arrived`),
// and on a 2-core machine took a core from the processes being measured: a
// real engine's host thread is idle there while its GPU computes.
//
// A thread at SCHED_IDLE gets only a sliver of a busy CPU (a weight of 3
// against 1024), so on a loaded machine a job can wait a long time. Whoever
// must wait for a job therefore runs it itself, at its own priority, once
// the queue has made no progress for a while; a job the thread has already
// started cannot be taken over, so the waiter raises the thread to normal
// priority instead, until that job is done (with every kvrelay process
// spinning, --idle-strategy spin, a started check took minutes). Nothing
// waits long on a starved thread. Jobs may thus run out of order and at the
// same time: a job must not depend on another.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

namespace kvrelay::sim {

class IdleQueue {
 public:
  // Tickets count posted jobs from 1; ticket 0 is a job that is always done.
  using Ticket = uint64_t;

  // `stall`: how long a waiter lets the thread make no progress before it
  // runs the queued jobs itself.
  explicit IdleQueue(std::chrono::milliseconds stall = std::chrono::milliseconds(20));
  ~IdleQueue();  // finishes every posted job, then joins
  IdleQueue(const IdleQueue&) = delete;
  IdleQueue& operator=(const IdleQueue&) = delete;

  // `urgent`: ahead of the jobs queued so far (someone will wait for it).
  Ticket post(std::function<void()> job, bool urgent = false);
  // True once job `t` has run.
  bool done(Ticket t) const;
  void wait(Ticket t);
  void wait_all();
  // A CPU at SCHED_IDLE is still a hyperthread and a share of the memory
  // bus taken from the other work: pause() keeps the thread from starting
  // jobs (and waits for the one it runs) while something is timed; resume()
  // lets it go on. A waiter resumes first: wait() on a paused queue runs
  // the job itself once the stall has passed.
  void pause();
  void resume();
  // Whether the thread got SCHED_IDLE (false: it runs at normal priority,
  // which still keeps the work off the engine's thread; so it does where the
  // process could not raise it again: no CAP_SYS_NICE, RLIMIT_NICE below 20).
  bool idle_priority() const;
  // How often a waiter raised the thread's priority to finish a started job.
  uint64_t priority_raises() const;
  // The thread's scheduling policy now (SCHED_IDLE between jobs where
  // idle_priority(): a raised thread drops back before its job counts as
  // done); -1 if it cannot be read.
  int thread_policy();

 private:
  void run();
  // Runs the queued job at `at` on the calling thread; `lock` is held on
  // entry and on return.
  void run_at(std::unique_lock<std::mutex>& lock, size_t at);
  bool done_locked(Ticket t) const;  // with the lock held
  // The thread is in a job someone waits for and made no progress: run it at
  // normal priority until the job ends (with the lock held).
  void raise_priority_locked();

  const std::chrono::milliseconds stall_;
  mutable std::mutex m_;
  std::condition_variable posted_;
  std::condition_variable finished_;
  // Jobs not yet started, each with its ticket.
  std::deque<std::pair<Ticket, std::function<void()>>> queue_;
  Ticket last_posted_ = 0;
  // Posted jobs that have not finished (they finish out of order: urgent
  // ones, and ones a waiter ran).
  std::set<Ticket> unfinished_;
  uint64_t jobs_finished_ = 0;  // progress, for a waiter's stall check
  uint64_t priority_raises_ = 0;
  bool stopping_ = false;
  bool paused_ = false;
  bool running_ = false;  // the thread is in a job
  bool idle_priority_ = false;
  bool raised_ = false;  // at normal priority until its current job ends
  std::thread thread_;
};

}  // namespace kvrelay::sim
