#include "worker/report_outbox.h"

#include "shm/clock.h"

namespace kvrelay::worker {

void ReportOutbox::report(uint64_t handle, records::ReportKind kind, uint64_t bytes,
                          const std::string& message, uint64_t first_copy_ns) {
  records::WorkerReport r{};
  r.first_copy_ns = first_copy_ns;
  r.handle = handle;
  r.kind = static_cast<uint32_t>(kind);
  r.rank = rank_;
  r.bytes_moved = bytes;
  r.set_message(message);
  // The common case goes straight to the ring: the queue (which allocates)
  // is only for a full ring, and keeps the order when it is used.
  if (waiting_.empty()) {
    r.reported_ns = mono_now_ns();
    if (ring_.try_push(r)) {
      notify_waiters(coordinator_doorbell_);
      return;
    }
  }
  waiting_.push_back(r);
  flush();
}

void ReportOutbox::flush() {
  bool pushed = false;
  while (!waiting_.empty()) {
    waiting_.front().reported_ns = mono_now_ns();
    if (!ring_.try_push(waiting_.front())) break;
    waiting_.pop_front();
    pushed = true;
  }
  if (!waiting_.empty()) CounterWriter(counters_).add(delayed_counter_);
  if (pushed) notify_waiters(coordinator_doorbell_);
}

}  // namespace kvrelay::worker
