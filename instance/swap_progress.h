// Per-layer progress of swap loads, in the control segment, so that an
// engine can start layer i's compute as soon as layer i is back on the
// device.
//
//   coordinator: assigns a slot when it dispatches a load (begin), and marks
//                it done or failed after the load's completion (end). A slot
//                is reassigned only once its load has ended; every assignment
//                gets a new generation.
//   worker:      after each layer, raises its rank's count (publish), but
//                only while the slot still holds the generation it was given:
//                a rank that never confirmed a withdrawn load cannot move the
//                counter of whatever load holds the slot next.
//   engine:      finds the load by its request tag and waits (Client::wait_layer).
//
// The slot's identity (tag, generation, layers, handle) is rewritten under a
// sequence lock (odd while being rewritten); each rank's count is one 64-bit
// word holding (generation << 32 | layers), so a reader never mixes two loads.
//
// A GPU stream may wait on a count (cuStreamWaitValue64, >=), and a stream
// cannot be told that a load failed: when a load ends badly, every rank's
// count of its generation becomes kReleasedLayers, which releases such
// waits. Host waiters read it as "failed".
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>

#include "instance/instance_config.h"
#include "shm/wait_event.h"

namespace kvrelay {

inline constexpr uint32_t kSwapProgressSlots = 1024;
inline constexpr uint32_t kNoProgressSlot = 0xffffffff;
// A failed load's count: above every layer, so GPU waits on it end.
inline constexpr uint32_t kReleasedLayers = 0xffffffff;

enum class SwapProgressState : uint32_t { kFree = 0, kLoading = 1, kDone = 2, kFailed = 3 };

struct alignas(64) SwapProgressSlot {
  std::atomic<uint32_t> sequence;    // odd while the coordinator rewrites the identity below
  std::atomic<uint32_t> state;       // SwapProgressState
  std::atomic<uint32_t> tag;         // records::request_tag of the request id; 0 when free
  std::atomic<uint32_t> generation;  // bumped by every assignment
  std::atomic<uint32_t> first_layer;
  std::atomic<uint32_t> layer_count;
  std::atomic<uint64_t> handle;  // the coordinator's request handle (tells reuses of a tag apart)
  uint8_t reserved[32];
  std::atomic<uint64_t> layers_done[kMaxTpSize];  // per rank: generation << 32 | layers loaded
  WaitEvent changed;
};

struct SwapProgressTable {
  WaitEvent slot_taken;  // a slot was assigned (a reader waiting for its load to appear)
  SwapProgressSlot slots[kSwapProgressSlots];
};

// A consistent copy of a slot's identity.
struct SwapProgressView {
  uint32_t slot = kNoProgressSlot;
  uint32_t generation = 0;
  SwapProgressState state = SwapProgressState::kFree;
  uint32_t tag = 0;
  uint32_t first_layer = 0;
  uint32_t layer_count = 0;
  uint64_t handle = 0;
};

namespace swap_progress {

// Coordinator: a slot for the load `handle` (a free one, else the one that
// ended longest ago), or kNoProgressSlot when every slot holds a running load.
// Returns the slot and, through `generation`, its new generation.
uint32_t begin(SwapProgressTable& t, uint64_t handle, uint32_t tag, uint32_t first_layer,
               uint32_t layer_count, uint32_t& generation);
void end(SwapProgressTable& t, uint32_t slot, bool finished);

// Worker: rank `rank` has loaded `layers` layers of the load that holds
// (slot, generation); ignored once the slot moved on.
void publish(SwapProgressTable& t, uint32_t slot, uint32_t generation, uint32_t rank,
             uint32_t layers);

// Anyone: the slot's identity, read consistently (nullopt while it is being
// rewritten, after a few tries).
std::optional<SwapProgressView> read(const SwapProgressTable& t, uint32_t slot);
// The newest running or ended load with `tag`.
std::optional<SwapProgressView> find(const SwapProgressTable& t, uint32_t tag);
// Layers rank `rank` has loaded for the load `view` (kReleasedLayers once it
// failed); nullopt once its slot holds another load.
std::optional<uint32_t> layers_done(const SwapProgressTable& t, const SwapProgressView& view,
                                    uint32_t rank);

}  // namespace swap_progress
}  // namespace kvrelay
