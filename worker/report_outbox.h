// A rank's reports to the coordinator (request finished, failed, cancelled,
// connected, pool registered), in the order the rank decided them. A report
// that finds the report ring full waits here, ahead of every later one, and
// goes out on the next flush: the coordinator drains the ring every loop
// turn, so none is ever dropped, and one that waits is counted.
//
// Not thread-safe: the worker's loop owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "schemas/records.h"
#include "shm/counters.h"
#include "shm/spsc_ring.h"
#include "shm/wait_event.h"

namespace kvrelay::worker {

class ReportOutbox {
 public:
  // `delayed_counter`: counted in `counters` each flush that leaves a report waiting.
  ReportOutbox(SpscProducer<records::WorkerReport> ring, uint32_t rank,
               WaitEvent& coordinator_doorbell, CountersBlock& counters, uint32_t delayed_counter)
      : ring_(std::move(ring)),
        rank_(rank),
        coordinator_doorbell_(coordinator_doorbell),
        counters_(counters),
        delayed_counter_(delayed_counter) {}

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
  CountersBlock& counters_;
  uint32_t delayed_counter_;
  std::deque<records::WorkerReport> waiting_;
};

}  // namespace kvrelay::worker
