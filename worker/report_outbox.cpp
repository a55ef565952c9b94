#include "worker/report_outbox.h"

#include "shm/clock.h"

namespace kvrelay::worker {

namespace {

// The reports that end a rank's part in a request (report_wake_gate.h).
bool is_final(records::ReportKind kind) {
  return kind == records::ReportKind::kFinished || kind == records::ReportKind::kFailed ||
         kind == records::ReportKind::kCancelled;
}

}  // namespace

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
      // Counted through the gate only once it is in the ring: the rank that
      // turns out last must wake a coordinator that finds this report too.
      // Every final report counts; only a finished one may then stay silent.
      const bool others_to_come =
          is_final(kind) && !report_wake_gate::last_to_report(finished_gates_, handle);
      if (others_to_come && kind == records::ReportKind::kFinished) {
        CounterWriter(counters_).add(unrung_counter_);
        return;
      }
      notify_waiters(coordinator_doorbell_);
      return;
    }
  }
  waiting_.push_back(r);
  flush();
}

// Reports that waited for room always wake the coordinator (they never count
// through the gate, so a rank after them may have skipped its wake).
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
