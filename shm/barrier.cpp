#include "shm/barrier.h"

#include <unistd.h>

#include "shm/chaos.h"
#include "shm/fault_point.h"
#include "shm/futex.h"
#include "shm/wait_event.h"

namespace kvrelay {

namespace {

constexpr uint64_t kPoisonedBit = uint64_t{1} << 31;

constexpr uint32_t generation_of(uint64_t w) {
  return static_cast<uint32_t>(w >> 32);
}
constexpr bool entered_by_poison(uint64_t w) {
  return (w & kPoisonedBit) != 0;
}
constexpr uint16_t parties_of(uint64_t w) {
  return static_cast<uint16_t>((w >> 16) & 0x7FFF);
}
constexpr uint16_t arrived_of(uint64_t w) {
  return static_cast<uint16_t>(w);
}
constexpr uint64_t pack(uint32_t gen, bool poisoned, uint16_t parties, uint16_t arrived) {
  return (uint64_t{gen} << 32) | (poisoned ? kPoisonedBit : 0) |
         (uint64_t{static_cast<uint16_t>(parties & 0x7FFF)} << 16) | arrived;
}

// The futex word: the generation, i.e. the upper 32 bits of the state word.
const void* generation_word(const std::atomic<uint64_t>& w) {
  return reinterpret_cast<const char*>(&w) + 4;
}

// Records how the transition into the generation of `w` happened (it is
// decided: `w` is the current word), before the caller replaces `w`.
void record_entry(BarrierState& s, uint64_t w) {
  const uint32_t previous = generation_of(w) - 1;
  s.history[previous % kBarrierHistory].store(
      (uint64_t{previous} << 1) | (entered_by_poison(w) ? 1 : 0), std::memory_order_release);
}

// How the round of generation `mine` ended, seen from word `now` (whose
// generation differs).
BarrierResult outcome(const BarrierState& s, uint32_t mine, uint64_t now) {
  if (generation_of(now) == mine + 1)
    return entered_by_poison(now) ? BarrierResult::kAborted : BarrierResult::kOk;
  const uint64_t h = s.history[mine % kBarrierHistory].load(std::memory_order_acquire);
  if (static_cast<uint32_t>(h >> 1) != mine) return BarrierResult::kAborted;  // too far behind
  return (h & 1) != 0 ? BarrierResult::kAborted : BarrierResult::kOk;
}

}  // namespace

const char* barrier_result_name(BarrierResult r) {
  switch (r) {
    case BarrierResult::kOk: return "ok";
    case BarrierResult::kTimeout: return "timeout";
    case BarrierResult::kAborted: return "aborted";
  }
  return "unknown";
}

void Barrier::arm(uint16_t parties) {
  const uint64_t w = s_->word.load(std::memory_order_acquire);
  s_->word.store(pack(generation_of(w), entered_by_poison(w), parties, 0),
                 std::memory_order_release);
}

BarrierResult Barrier::wait(Deadline deadline) {
  uint64_t w = s_->word.load(std::memory_order_acquire);
  uint32_t gen = 0;
  uint16_t parties = 0;
  for (;;) {
    KVRELAY_CHAOS_POINT();
    gen = generation_of(w);
    parties = parties_of(w);
    const uint16_t arrived = arrived_of(w);
    if (parties == 0) return BarrierResult::kAborted;  // not armed: nothing to wait for
    if (arrived + 1 >= parties) {
      // Last to arrive: complete the round and wake everybody.
      record_entry(*s_, w);
      if (s_->word.compare_exchange_weak(w, pack(gen + 1, false, parties, 0),
                                         std::memory_order_acq_rel, std::memory_order_acquire)) {
        s_->rounds_completed.fetch_add(1, std::memory_order_relaxed);
        futex_wake_word(generation_word(s_->word), INT32_MAX);
        return BarrierResult::kOk;
      }
    } else if (s_->word.compare_exchange_weak(
                   w, pack(gen, entered_by_poison(w), parties, arrived + 1),
                   std::memory_order_acq_rel, std::memory_order_acquire)) {
      break;
    }
  }
  KVRELAY_FAULT_POINT("barrier.arrived");

  static const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (parties <= cpus) {
    // The spin idle strategy spins up to the deadline (then withdraws below).
    const uint64_t spin_until = idle_strategy() == IdleStrategy::kSpin
                                    ? deadline.ns()
                                    : mono_now_ns() + default_spin_ns();
    for (uint32_t i = 1;; ++i) {
      const uint64_t now = s_->word.load(std::memory_order_acquire);
      if (generation_of(now) != gen) return outcome(*s_, gen, now);
      cpu_relax();
      if ((i & 63) == 0 && mono_now_ns() >= spin_until) break;
    }
  }
  for (;;) {
    const FutexWait r = futex_wait_word(generation_word(s_->word), gen, deadline);
    w = s_->word.load(std::memory_order_acquire);
    if (generation_of(w) != gen) return outcome(*s_, gen, w);
    if (r != FutexWait::kTimedOut && !deadline.passed()) continue;
    // Timed out: withdraw our arrival unless the round moved on meanwhile.
    for (;;) {
      if (generation_of(w) != gen) return outcome(*s_, gen, w);
      if (s_->word.compare_exchange_weak(w, w - 1, std::memory_order_acq_rel,
                                         std::memory_order_acquire)) {
        s_->timeouts.fetch_add(1, std::memory_order_relaxed);
        return BarrierResult::kTimeout;
      }
    }
  }
}

uint32_t Barrier::poison(uint16_t survivors) {
  uint64_t w = s_->word.load(std::memory_order_acquire);
  for (;;) {
    record_entry(*s_, w);
    if (s_->word.compare_exchange_weak(w, pack(generation_of(w) + 1, true, survivors, 0),
                                       std::memory_order_acq_rel, std::memory_order_acquire))
      break;
  }
  s_->rounds_poisoned.fetch_add(1, std::memory_order_relaxed);
  futex_wake_word(generation_word(s_->word), INT32_MAX);
  return generation_of(w);
}

BarrierSnapshot Barrier::snapshot() const {
  const uint64_t w = s_->word.load(std::memory_order_acquire);
  return BarrierSnapshot{generation_of(w),
                         parties_of(w),
                         arrived_of(w),
                         s_->rounds_completed.load(std::memory_order_relaxed),
                         s_->rounds_poisoned.load(std::memory_order_relaxed),
                         s_->timeouts.load(std::memory_order_relaxed)};
}

}  // namespace kvrelay
