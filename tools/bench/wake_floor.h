// The floor under kvrelay's latency: a bare chain of wake-ups between
// processes, with the same WaitEvent wait and notify kvrelay uses and no work
// at all. Dispatch (engine -> coordinator -> worker) is two hops; the
// completion path (engine's last layer -> worker -> coordinator -> engine)
// is three. kvrelay's figure divided by the chain's, measured in the same
// run, says how much of it is kvrelay's own.
#pragma once

#include <cstdint>
#include <vector>

#include "shm/wait_event.h"

namespace kvrelay::bench {

// `hops` forked processes each wait for the one before and wake the next;
// the parent starts each round after everyone parked (`settle_us`, as the
// request benchmark does) and the last process stamps when it woke.
// Returns the rounds' start -> last wake times in microseconds (empty on
// failure). The children idle with `idle`.
std::vector<double> measure_wake_chain(uint32_t hops, int samples, IdleStrategy idle,
                                       uint32_t settle_us);

}  // namespace kvrelay::bench
