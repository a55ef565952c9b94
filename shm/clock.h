// Monotonic time and deadlines shared between processes: the public types
// (kvrelay/deadline.h), used unchanged inside kvrelay.
#pragma once

#include <cstdint>
#include <optional>

#include "kvrelay/deadline.h"

namespace kvrelay {

// Inside kvrelay, points in time are uint64_t nanoseconds of CLOCK_MONOTONIC
// (they are stored in shared memory and in records) and durations are Nanos;
// this is the one conversion between them, so that no code multiplies
// milliseconds by hand: `now_ns + ns_of(50ms)`, `ns_of(std::chrono::milliseconds(ms))`.
constexpr uint64_t ns_of(Nanos d) {
  return d.count() <= 0 ? 0 : static_cast<uint64_t>(d.count());
}

// How long before `now_ns` another process stamped `stamp_ns` (both
// CLOCK_MONOTONIC on one host): the one rule for timing a hop from a stamp
// that crossed a process boundary. 0 (not stamped) and a stamp from the
// future (a bug or a forgery) give nothing: never timed, never an error.
constexpr std::optional<uint64_t> stamp_age(uint64_t stamp_ns, uint64_t now_ns) {
  if (stamp_ns == 0 || stamp_ns > now_ns) return std::nullopt;
  return now_ns - stamp_ns;
}

}  // namespace kvrelay
