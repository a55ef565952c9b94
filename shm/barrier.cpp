#include "shm/barrier.h"

#include <unistd.h>

#include "shm/chaos.h"
#include "shm/futex.h"
#include "shm/wait_event.h"

namespace kvrelay {

namespace {

constexpr uint32_t generation_of(uint64_t w) {
  return static_cast<uint32_t>(w >> 32);
}
constexpr uint16_t parties_of(uint64_t w) {
  return static_cast<uint16_t>(w >> 16);
}
constexpr uint16_t arrived_of(uint64_t w) {
  return static_cast<uint16_t>(w);
}
constexpr uint64_t pack(uint32_t gen, uint16_t parties, uint16_t arrived) {
  return (uint64_t{gen} << 32) | (uint64_t{parties} << 16) | arrived;
}

// The futex word: the generation, i.e. the upper 32 bits of the state word.
const void* generation_word(const std::atomic<uint64_t>& w) {
  return reinterpret_cast<const char*>(&w) + 4;
}

BarrierResult outcome(uint32_t my_generation, uint32_t now_generation) {
  return ((now_generation - my_generation) & 1U) != 0 ? BarrierResult::kOk
                                                      : BarrierResult::kAborted;
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
  s_->word.store(pack(generation_of(w), parties, 0), std::memory_order_release);
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
      if (s_->word.compare_exchange_weak(w, pack(gen + 1, parties, 0), std::memory_order_acq_rel,
                                         std::memory_order_acquire)) {
        s_->rounds_completed.fetch_add(1, std::memory_order_relaxed);
        futex_wake_word(generation_word(s_->word), INT32_MAX);
        return BarrierResult::kOk;
      }
    } else if (s_->word.compare_exchange_weak(w, pack(gen, parties, arrived + 1),
                                              std::memory_order_acq_rel,
                                              std::memory_order_acquire)) {
      break;
    }
  }

  static const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (parties <= cpus) {
    const uint64_t spin_until = mono_now_ns() + default_spin_ns();
    for (uint32_t i = 1;; ++i) {
      const uint32_t now = generation_of(s_->word.load(std::memory_order_acquire));
      if (now != gen) return outcome(gen, now);
      cpu_relax();
      if ((i & 63) == 0 && mono_now_ns() >= spin_until) break;
    }
  }
  for (;;) {
    const FutexWait r = futex_wait_word(generation_word(s_->word), gen, deadline);
    w = s_->word.load(std::memory_order_acquire);
    if (generation_of(w) != gen) return outcome(gen, generation_of(w));
    if (r != FutexWait::kTimedOut && !deadline.passed()) continue;
    // Timed out: withdraw our arrival unless the round moved on meanwhile.
    for (;;) {
      if (generation_of(w) != gen) return outcome(gen, generation_of(w));
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
  while (!s_->word.compare_exchange_weak(w, pack(generation_of(w) + 2, survivors, 0),
                                         std::memory_order_acq_rel, std::memory_order_acquire)) {
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
