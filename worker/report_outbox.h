// A rank's reports to the coordinator (request finished, failed, cancelled,
// connected, pool registered), in the order the rank decided them. A report
// that finds the report ring full waits here, ahead of every later one, and
// goes out on the next flush: the coordinator drains the ring every loop
// turn, so none is ever dropped, and one that waits is counted.
//
// A finished report wakes the coordinator only if it is the request's last
// (report_wake_gate.h); every other report always does.
//
// Not thread-safe: the worker's loop owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "instance/report_wake_gate.h"
#include "schemas/records.h"
#include "shm/counters.h"
#include "shm/spsc_ring.h"
#include "shm/wait_event.h"

namespace kvrelay::worker {

class ReportOutbox {
 public:
  // Counted in `counters`: `delayed_counter` each flush that leaves a report
  // waiting, `unrung_counter` each finished report that woke nobody.
  ReportOutbox(SpscProducer<records::WorkerReport> ring, uint32_t rank,
               WaitEvent& coordinator_doorbell, ReportWakeGates& finished_gates,
               CountersBlock& counters, uint32_t delayed_counter, uint32_t unrung_counter)
      : ring_(std::move(ring)),
        rank_(rank),
        coordinator_doorbell_(coordinator_doorbell),
        finished_gates_(finished_gates),
        counters_(counters),
        delayed_counter_(delayed_counter),
        unrung_counter_(unrung_counter) {}

  // Queues a report and sends what the ring has room for.
  void report(uint64_t handle, records::ReportKind kind, uint64_t bytes, const std::string& message,
              uint64_t first_copy_ns = 0);
  // Sends what waits, in order, and rings the coordinator if anything went.
  void flush();
  size_t waiting() const { return waiting_.size(); }

 private:
  SpscProducer<records::WorkerReport> ring_;
  uint32_t rank_;
  WaitEvent& coordinator_doorbell_;
  ReportWakeGates& finished_gates_;
  CountersBlock& counters_;
  uint32_t delayed_counter_;
  uint32_t unrung_counter_;
  std::deque<records::WorkerReport> waiting_;
};

}  // namespace kvrelay::worker
