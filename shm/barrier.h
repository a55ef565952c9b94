// An interprocess barrier that cannot hang: every wait has a deadline, and a
// participant's death poisons the round so that everybody else returns at
// once instead of at their timeout.
//
// State is one 64-bit word, so that arriving, completing, withdrawing after a
// timeout and poisoning are each a single CAS and can never interleave:
//
//   bits 63..32  generation: the futex word (the upper half, little-endian)
//   bit  31      how the barrier entered this generation: 0 completed, 1 poisoned
//   bits 30..16  parties:    how many must arrive for a round to complete
//   bits 15..0   arrived:    how many have arrived in this generation
//
// Every transition (a round completed, or poisoned) advances the generation
// by one and says in the word which kind it was. A waiter of generation g
// that finds g + 1 reads its outcome from that bit. A waiter that slept
// through more than one transition (it was paused across a poison and the
// re-armed round completed without it, say) finds its outcome in `history`:
// whoever makes the transition out of g + 1 first records there how g ended,
// which it knows from the word it replaces. A waiter so far behind that the
// history no longer holds its generation returns kAborted: it never mistakes
// an aborted round for a completed one.
//
// Poisoning re-arms the barrier at once with the survivors' count.
// Pthread and Boost.Interprocess barriers can do neither of these.
//
// Who may call what: participants call wait(); the supervisor (coordinator)
// calls poison() and arm(). Anyone may read snapshot().
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>

#include "shm/clock.h"

namespace kvrelay {

static_assert(std::endian::native == std::endian::little, "the futex word is the upper half");

inline constexpr uint32_t kBarrierHistory = 16;

struct alignas(64) BarrierState {
  std::atomic<uint64_t> word{0};
  std::atomic<uint64_t> rounds_completed{0};
  std::atomic<uint64_t> rounds_poisoned{0};
  std::atomic<uint64_t> timeouts{0};
  uint8_t reserved[32];
  // (generation << 1 | poisoned) of past transitions, by generation % 16.
  std::atomic<uint64_t> history[kBarrierHistory];
};
static_assert(sizeof(BarrierState) == 64 + 8 * kBarrierHistory);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

enum class BarrierResult { kOk, kTimeout, kAborted };
const char* barrier_result_name(BarrierResult r);

struct BarrierSnapshot {
  uint32_t generation;
  uint16_t parties;
  uint16_t arrived;
  uint64_t rounds_completed;
  uint64_t rounds_poisoned;
  uint64_t timeouts;
};

class Barrier {
 public:
  static constexpr uint32_t kMaxParties = 0x7FFF;

  explicit Barrier(BarrierState& state) : s_(&state) {}

  // Supervisor: sets the number of parties and starts a fresh round. Only
  // when nobody is waiting (at creation); use poison() otherwise.
  void arm(uint16_t parties);

  // Participant: arrive and wait for the others. kOk when all `parties`
  // arrived; kAborted when the round was poisoned; kTimeout when `deadline`
  // passed first (this arrival is then withdrawn, the round goes on without
  // it). Spins briefly before parking, unless there are more parties than
  // CPUs: then a spinning waiter would only keep a late arriver off its CPU.
  [[nodiscard]] BarrierResult wait(Deadline deadline);

  // Supervisor: aborts the current round (every waiter returns kAborted at
  // once) and re-arms the barrier for `survivors` parties. Returns the
  // poisoned generation.
  uint32_t poison(uint16_t survivors);

  BarrierSnapshot snapshot() const;

 private:
  BarrierState* s_;
};

}  // namespace kvrelay
