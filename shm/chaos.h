// Schedule fuzzing for the lock-free code: KVRELAY_CHAOS_POINT() yields the
// CPU at random, so that the windows between a ring's steps (claim, write,
// commit; read, zero, release) get stretched and interleaved in orders a
// quiet machine never produces. Off (an empty statement) unless the build
// defines KVRELAY_CHAOS, which the tsan preset does.
//
// It found the stale-head_cache wrap-around in MpscRing::try_claim.
#pragma once

#ifdef KVRELAY_CHAOS
#include <sched.h>

#include <cstdint>

namespace kvrelay::chaos_detail {
inline void maybe_yield() {
  thread_local uint32_t state =
      0x9E3779B9U ^ static_cast<uint32_t>(reinterpret_cast<uintptr_t>(&state));
  state ^= state << 13;
  state ^= state >> 17;
  state ^= state << 5;
  if (state % 8 == 0) sched_yield();
}
}  // namespace kvrelay::chaos_detail
#define KVRELAY_CHAOS_POINT() ::kvrelay::chaos_detail::maybe_yield()
#else
#define KVRELAY_CHAOS_POINT() \
  do {                        \
  } while (false)
#endif
