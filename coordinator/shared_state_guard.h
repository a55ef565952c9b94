// The coordinator's watch over the shared state that other processes of its
// user could overwrite: the instance state word and its own liveness slot
// (put back, logged and counted), the rings' repairs (logged once and
// counted), and the decision whether the instance can go on at all (a
// truncated control segment, or a submit or completion ring whose record
// boundaries cannot be trusted, cannot).
//
// Not thread-safe: the coordinator's loop calls it each turn.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/ring_writer.h"
#include "instance/control_segment.h"
#include "schemas/records.h"
#include "shm/counters.h"
#include "shm/mpsc_ring.h"
#include "shm/spsc_ring.h"

namespace kvrelay::coordinator {

// The rings the coordinator reads and writes, as the loop holds them.
struct CoordinatorRings {
  MpscRing& submit;
  RingWriter& completions;
  std::vector<RingWriter>& tasks;
  std::vector<SpscRing<records::WorkerReport>>& reports;
};

class SharedStateGuard {
 public:
  // `counters`: the coordinator's block (kSharedStateRepairs).
  SharedStateGuard(const ControlSegment& control, CountersBlock& counters);

  // Puts back what the coordinator owns and notes what the rings repaired
  // (at most every 10 ms, the truncation check every call). Returns why the
  // instance is broken beyond repair, if it is. `state`: what the coordinator
  // last set.
  std::optional<std::string> check(uint64_t now_ns, InstanceState state, CoordinatorRings rings);

 private:
  const ControlSegment& control_;
  CountersBlock& counters_;
  uint64_t next_check_ns_ = 0;
  std::vector<uint64_t> last_report_repairs_;  // per rank
};

}  // namespace kvrelay::coordinator
