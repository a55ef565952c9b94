// Monotonic time and deadlines shared between processes.
//
// Part of kvrelay's public face (self-contained: the standard library only):
// every blocking call of the client takes a Deadline.
//
// steady_clock is CLOCK_MONOTONIC on Linux, which every process on a host
// reads identically, so a timestamp written into shared memory by one process
// can be compared with `now` in another (heartbeats, deadlines).
#pragma once

#include <chrono>
#include <cstdint>

namespace kvrelay {

using Nanos = std::chrono::nanoseconds;

inline uint64_t mono_now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<Nanos>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

// An absolute point on the monotonic clock. Every blocking call in kvrelay
// takes one; there is no "wait forever".
class Deadline {
 public:
  static Deadline after(Nanos d) {
    return Deadline(mono_now_ns() + static_cast<uint64_t>(d.count()));
  }
  static Deadline at_ns(uint64_t monotonic_ns) { return Deadline(monotonic_ns); }
  // A deadline that has already passed: a blocking call becomes a single try.
  static Deadline now() { return Deadline(0); }

  uint64_t ns() const { return at_ns_; }
  bool passed() const { return mono_now_ns() >= at_ns_; }
  Nanos remaining() const {
    const uint64_t now = mono_now_ns();
    return now >= at_ns_ ? Nanos(0) : Nanos(at_ns_ - now);
  }

 private:
  explicit Deadline(uint64_t at) : at_ns_(at) {}
  uint64_t at_ns_;
};

}  // namespace kvrelay
