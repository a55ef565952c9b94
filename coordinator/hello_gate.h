// When a pending engine hello may be acknowledged (engine_sessions.h): once
// every live worker has read everything written to it before the hello, the
// withdrawals of dead sessions among it. The gate takes, per rank, the
// position of its task ring's tail once nothing waits in the writers'
// backlogs, and opens when each live rank's head has reached it.
//
// Not thread-safe: the coordinator's loop owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "coordinator/ring_writer.h"

namespace kvrelay::coordinator {

class HelloGate {
 public:
  // More was written that the pending hellos must follow (withdrawals, or
  // another hello and what follows it): the positions are taken afresh.
  void retarget() { targets_.clear(); }

  // Whether every rank that `rank_up` says is serving has read its task ring
  // up to the positions taken. Closes (and clears the positions) once it
  // has opened, for the next hello.
  bool open(const std::vector<RingWriter>& tasks, const std::function<bool(uint32_t)>& rank_up);

 private:
  std::vector<uint64_t> targets_;  // per rank: the tail its worker must reach
};

}  // namespace kvrelay::coordinator
