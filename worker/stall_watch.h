// The worker's watchdog: once a second it asks the scheduler which requests
// have not reported long after their final chunk was signalled on this rank
// (or after they ended with transfers still in flight), logs each one the
// first time it is found, with what it waits for, counts it, and lists them
// in the control segment for kvrelay-dump (instance/request_stalls.h).
//
// It does not fail them. What it finds ends at the request's deadline, which
// every request has: a decode half that is late (its decode instance may
// simply be busy, and a late half is served), or a transport that has not
// completed (tcp and rdma fail a silent peer after the peer timeout). Failing
// earlier would turn a busy decode instance into errors. The one state that
// can never end well, a final chunk taken by another session of the slot, is
// failed by the scheduler itself, at once (send_scheduler.h).
//
// Single-threaded: the worker's loop owns it.
#pragma once

#include <cstdint>
#include <vector>

#include "instance/request_stalls.h"
#include "shm/clock.h"
#include "worker/send_scheduler.h"

namespace kvrelay::worker {

class StallWatch {
 public:
  StallWatch(uint32_t rank, Nanos report_after, RankStalls& board)
      : rank_(rank), report_after_ns_(ns_of(report_after)), board_(board) {}

  // Looks at most once a second (cheap otherwise). True when it found a
  // request stalled for the first time.
  bool check(SendScheduler& scheduler, uint64_t now_ns);
  // Requests found stalled so far (each counted once).
  uint64_t found() const { return found_; }
  // Lists what the last check() found, when it returned true (after the
  // caller mirrored found() into the counters).
  void publish();

 private:
  uint32_t rank_;
  uint64_t report_after_ns_;
  RankStalls& board_;
  uint64_t next_check_ns_ = 0;
  uint64_t found_ = 0;
  bool listed_any_ = false;  // the board shows some: clear it once none are left
  std::vector<SendScheduler::Stall> stalls_;
  std::vector<StallRecord> records_;
};

}  // namespace kvrelay::worker
