#include "idle_queue.h"

#include <pthread.h>
#include <sched.h>

namespace kvrelay::sim {

IdleQueue::IdleQueue(std::chrono::milliseconds stall) : stall_(stall) {
  thread_ = std::thread([this] { run(); });
}

IdleQueue::~IdleQueue() {
  resume();
  wait_all();
  {
    std::lock_guard lock(m_);
    stopping_ = true;
  }
  posted_.notify_all();
  thread_.join();
}

IdleQueue::Ticket IdleQueue::post(std::function<void()> job, bool urgent) {
  Ticket t = 0;
  {
    std::lock_guard lock(m_);
    t = ++last_posted_;
    unfinished_.insert(t);
    if (urgent) {
      queue_.emplace_front(t, std::move(job));
    } else {
      queue_.emplace_back(t, std::move(job));
    }
  }
  posted_.notify_one();
  return t;
}

bool IdleQueue::done(Ticket t) const {
  std::lock_guard lock(m_);
  return done_locked(t);
}

bool IdleQueue::done_locked(Ticket t) const {
  return t <= last_posted_ && !unfinished_.contains(t);
}

void IdleQueue::pause() {
  std::unique_lock lock(m_);
  paused_ = true;
  while (!finished_.wait_for(lock, stall_, [&] { return !running_; }))
    raise_priority_locked();
}

void IdleQueue::resume() {
  {
    std::lock_guard lock(m_);
    paused_ = false;
  }
  posted_.notify_all();
}

bool IdleQueue::idle_priority() const {
  std::lock_guard lock(m_);
  return idle_priority_;
}

uint64_t IdleQueue::priority_raises() const {
  std::lock_guard lock(m_);
  return priority_raises_;
}

int IdleQueue::thread_policy() {
  std::lock_guard lock(m_);  // not between a job's end and the drop back
  int policy = -1;
  sched_param param{};
  return pthread_getschedparam(thread_.native_handle(), &policy, &param) == 0 ? policy : -1;
}

void IdleQueue::raise_priority_locked() {
  if (!running_ || !idle_priority_ || raised_) return;
  sched_param none{};
  if (pthread_setschedparam(thread_.native_handle(), SCHED_OTHER, &none) == 0) {
    raised_ = true;
    ++priority_raises_;
  }
}

void IdleQueue::wait(Ticket t) {
  std::unique_lock lock(m_);
  while (!done_locked(t)) {
    const uint64_t seen = jobs_finished_;
    const bool moved =
        finished_.wait_for(lock, stall_, [&] { return done_locked(t) || jobs_finished_ != seen; });
    if (moved) continue;
    // The thread made no progress (starved behind busy CPUs): run job `t`
    // here if it is still queued; one the thread holds is finished at
    // normal priority (it may hold another job, which then goes first).
    bool queued = false;
    for (size_t at = 0; at < queue_.size(); ++at)
      if (queue_[at].first == t) {
        run_at(lock, at);
        queued = true;
        break;
      }
    if (!queued) raise_priority_locked();
  }
}

void IdleQueue::wait_all() {
  Ticket last = 0;
  {
    std::lock_guard lock(m_);
    last = last_posted_;
  }
  for (Ticket t = 1; t <= last; ++t)
    wait(t);
}

namespace {

// Whether a thread of this process may go to SCHED_IDLE and come back to
// SCHED_OTHER at nice 0. Lowering needs no privilege; coming back needs
// CAP_SYS_NICE or an RLIMIT_NICE of 20 (the default, 0, refuses), so it is
// tried once on a throwaway thread.
bool can_leave_idle_priority() {
  bool ok = false;
  std::thread probe([&] {
    sched_param none{};
    ok = pthread_setschedparam(pthread_self(), SCHED_IDLE, &none) == 0 &&
         pthread_setschedparam(pthread_self(), SCHED_OTHER, &none) == 0;
  });
  probe.join();
  return ok;
}

}  // namespace

void IdleQueue::run() {
  // At SCHED_IDLE only where a waiter can raise the thread again (a started
  // job would otherwise hold its waiter for as long as the CPUs stay busy);
  // elsewhere it runs at normal priority, still off the engine's thread.
  sched_param none{};
  const bool idle =
      can_leave_idle_priority() && pthread_setschedparam(pthread_self(), SCHED_IDLE, &none) == 0;
  std::unique_lock lock(m_);
  idle_priority_ = idle;
  for (;;) {
    posted_.wait(lock, [&] { return stopping_ || (!paused_ && !queue_.empty()); });
    if (stopping_ && queue_.empty()) return;
    if (paused_ || queue_.empty()) continue;
    running_ = true;
    run_at(lock, 0);
    running_ = false;
    if (raised_) {  // back to SCHED_IDLE for the next job
      pthread_setschedparam(pthread_self(), SCHED_IDLE, &none);
      raised_ = false;
    }
    finished_.notify_all();
  }
}

void IdleQueue::run_at(std::unique_lock<std::mutex>& lock, size_t at) {
  auto [ticket, job] = std::move(queue_[at]);
  queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(at));
  lock.unlock();
  job();
  lock.lock();
  unfinished_.erase(ticket);
  ++jobs_finished_;
  finished_.notify_all();
}

}  // namespace kvrelay::sim
