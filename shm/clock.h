// Monotonic time and deadlines shared between processes: the public types
// (kvrelay/deadline.h), used unchanged inside kvrelay.
#pragma once

#include "kvrelay/deadline.h"

namespace kvrelay {

// Inside kvrelay, points in time are uint64_t nanoseconds of CLOCK_MONOTONIC
// (they are stored in shared memory and in records) and durations are Nanos;
// this is the one conversion between them, so that no code multiplies
// milliseconds by hand: `now_ns + ns_of(50ms)`, `ns_of(std::chrono::milliseconds(ms))`.
constexpr uint64_t ns_of(Nanos d) {
  return d.count() <= 0 ? 0 : static_cast<uint64_t>(d.count());
}

}  // namespace kvrelay
