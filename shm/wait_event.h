// WaitEvent: "spin briefly, then park on a futex", with notifiers that make a
// system call only when somebody is actually parked.
//
// This is an eventcount. The waiter announces itself (waiters += 1) and then
// re-checks its condition; the notifier publishes its data and then looks at
// `waiters`. The two steps on each side are ordered by an asymmetric fence
// pair (asymmetric_fence.h): the notifier, on every publish, pays only a
// compiler barrier; the waiter, once per park, pays a membarrier. Either the
// waiter sees the data and does not sleep, or the notifier sees the waiter
// and wakes it. The `sequence` word is the futex word: bumping it before
// FUTEX_WAKE makes a waiter that is just about to sleep return at once
// (EAGAIN).
//
// Lives in shared memory; any process that maps it may wait or notify.
// A waiter killed while parked leaves `waiters` too high, which costs later
// notifiers one spare syscall each but never loses a wake-up.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

#include "shm/asymmetric_fence.h"
#include "shm/clock.h"
#include "shm/futex.h"

namespace kvrelay {

struct alignas(64) WaitEvent {
  std::atomic<uint32_t> sequence{0};    // futex word, bumped by each notify that finds waiters
  std::atomic<uint32_t> waiters{0};     // processes parked or about to park
  std::atomic<uint64_t> wake_calls{0};  // FUTEX_WAKE syscalls made (observability, tests)
};
static_assert(sizeof(WaitEvent) == 64);

// How long a waiter spins before parking: about the cost of a futex park and
// wake on these machines (p50 ~6 us, measured by kvrelay-bench-barrier), so
// that a waiter never loses more than twice the optimum. Zero on a single
// CPU, where spinning only delays the process it waits for.
uint64_t default_spin_ns();

// If the heavy fence is unavailable, a parked waiter re-checks this often.
inline constexpr uint64_t kDegradedParkNs = 1'000'000;

// How a process waits when it has nothing to do (Aeron's idle strategies).
// Set once per process at startup (the coordinator's and the workers'
// --idle-strategy); every wait_until of the process follows it.
//   park     spin default_spin_ns(), then sleep on the futex. Costs no CPU
//            while idle; a wake-up costs a futex wake and a reschedule.
//   backoff  spin, then sched_yield() for up to kBackoffYieldNs, then park:
//            a wake-up within that window costs no syscall on the notifier's
//            side, and the CPU is given to anyone else who wants it.
//   spin     never sleep: poll until ready or the deadline. One whole CPU
//            per process, always; the lowest latency, for dedicated cores.
enum class IdleStrategy : uint8_t { kPark, kBackoff, kSpin };
inline constexpr uint64_t kBackoffYieldNs = 200'000;

void set_idle_strategy(IdleStrategy s);
IdleStrategy idle_strategy();
const char* idle_strategy_name(IdleStrategy s);
// "park", "backoff" or "spin"; false for anything else.
bool parse_idle_strategy(std::string_view text, IdleStrategy& out);

namespace detail {
void yield_cpu();
}

// Waits until `ready()` returns true (returns true), or until `deadline`
// passes (returns false). `ready` must read shared state with acquire loads.
template <class Ready>
bool wait_until(WaitEvent& ev, Ready&& ready, Deadline deadline,
                uint64_t spin_ns = default_spin_ns()) {
  if (ready()) return true;
  const IdleStrategy idle = idle_strategy();
  if (idle == IdleStrategy::kSpin) {
    for (uint32_t i = 1;; ++i) {
      if (ready()) return true;
      cpu_relax();
      if ((i & 63) == 0 && deadline.passed()) return ready();
    }
  }
  if (spin_ns > 0) {
    const uint64_t spin_until = mono_now_ns() + spin_ns;
    for (uint32_t i = 1;; ++i) {
      if (ready()) return true;
      cpu_relax();
      if ((i & 63) == 0 && mono_now_ns() >= spin_until) break;
    }
  }
  if (idle == IdleStrategy::kBackoff) {
    const uint64_t yield_until = mono_now_ns() + kBackoffYieldNs;
    while (mono_now_ns() < yield_until && !deadline.passed()) {
      if (ready()) return true;
      detail::yield_cpu();
    }
  }
  for (;;) {
    const uint32_t seq = ev.sequence.load(std::memory_order_acquire);
    ev.waiters.fetch_add(1, std::memory_order_seq_cst);
    const bool fenced_everyone = heavy_fence();  // announce, then re-check (see top)
    if (ready()) {
      ev.waiters.fetch_sub(1, std::memory_order_relaxed);
      return true;
    }
    Deadline park_until = deadline;
    if (!fenced_everyone) {
      const Deadline degraded = Deadline::after(Nanos(kDegradedParkNs));
      if (degraded.ns() < park_until.ns()) park_until = degraded;
    }
    const FutexWait r = futex_wait(ev.sequence, seq, park_until);
    ev.waiters.fetch_sub(1, std::memory_order_relaxed);
    if (ready()) return true;
    if ((r == FutexWait::kTimedOut && park_until.ns() == deadline.ns()) || deadline.passed())
      return false;
  }
}

// Call after publishing data (with a release store) that may make a waiter's
// condition true. Costs a compiler barrier and one load when nobody waits.
inline void notify_waiters(WaitEvent& ev) noexcept {
  light_fence();  // publish, then look for waiters (see top)
  if (ev.waiters.load(std::memory_order_relaxed) == 0) return;
  ev.sequence.fetch_add(1, std::memory_order_release);
  ev.wake_calls.fetch_add(1, std::memory_order_relaxed);
  futex_wake_all(ev.sequence);
}

}  // namespace kvrelay
