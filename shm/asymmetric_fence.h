// Asymmetric fences: a near-free fence for the hot side of a Dekker-style
// handshake, paid for by an expensive one on the rare side.
//
// Rings must not lose a wake-up: a producer publishes a record, then looks
// whether the consumer is parked; the consumer announces that it is parking,
// then looks for records. Each side needs a full (StoreLoad) fence between
// its store and its load, or both can miss each other. A full fence on every
// push costs a drained store buffer - it halved ring throughput here.
//
// So the hot side (light_fence: notifiers, once per publish) only stops the
// compiler from reordering, and the cold side (heavy_fence: a waiter about to
// sleep) runs membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED), which makes every
// CPU currently running a registered process execute a full fence. Either the
// notifier's store is visible to the waiter's re-check, or the notifier's
// load of `waiters` comes after the waiter announced itself (the argument of
// Linux's membarrier(2) and folly's asymmetricHeavyBarrier).
//
// Every process that calls light_fence registers itself on first use (and
// again after fork). If the kernel or a seccomp policy refuses membarrier,
// light_fence falls back to a real fence, and heavy_fence reports the failure
// so that a waiter can bound its sleep.
#pragma once

#include <atomic>

namespace kvrelay {

namespace fence_detail {
// 0: not decided yet in this process; 1: registered (compiler barrier
// suffices); 2: membarrier unavailable (real fence).
extern std::atomic<int> light_mode;
int decide_light_mode();
}  // namespace fence_detail

// The cheap side. Orders this thread's earlier stores before its later loads
// as seen by a thread that runs heavy_fence().
inline void light_fence() {
  int mode = fence_detail::light_mode.load(std::memory_order_relaxed);
  if (mode == 0) mode = fence_detail::decide_light_mode();  // registers; acts as a full fence
  if (mode == 1) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}

// The expensive side (about a microsecond). Returns false when membarrier is
// unavailable; a full fence was still executed, but notifiers in other
// processes may not have fenced, so the caller must not sleep unboundedly.
bool heavy_fence();

}  // namespace kvrelay
