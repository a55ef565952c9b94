#include "instance/swap_progress.h"

namespace kvrelay::swap_progress {

namespace {

uint64_t pack(uint32_t generation, uint32_t layers) {
  return (uint64_t{generation} << 32) | layers;
}

}  // namespace

uint32_t begin(SwapProgressTable& t, uint64_t handle, uint32_t tag, uint32_t first_layer,
               uint32_t layer_count, uint32_t& generation) {
  SwapProgressSlot* pick = nullptr;
  for (SwapProgressSlot& slot : t.slots) {
    const auto state = static_cast<SwapProgressState>(slot.state.load(std::memory_order_acquire));
    if (state == SwapProgressState::kFree) {
      pick = &slot;
      break;
    }
    if (state != SwapProgressState::kLoading &&
        (pick == nullptr || slot.handle.load(std::memory_order_relaxed) <
                                pick->handle.load(std::memory_order_relaxed)))
      pick = &slot;
  }
  if (pick == nullptr) return kNoProgressSlot;
  const uint32_t seq = pick->sequence.load(std::memory_order_relaxed);
  pick->sequence.store(seq | 1U, std::memory_order_relaxed);  // odd: being rewritten
  std::atomic_thread_fence(std::memory_order_release);
  generation = pick->generation.load(std::memory_order_relaxed) + 1;
  pick->generation.store(generation, std::memory_order_relaxed);
  pick->tag.store(tag, std::memory_order_relaxed);
  pick->handle.store(handle, std::memory_order_relaxed);
  pick->first_layer.store(first_layer, std::memory_order_relaxed);
  pick->layer_count.store(layer_count, std::memory_order_relaxed);
  for (auto& done : pick->layers_done)
    done.store(pack(generation, 0), std::memory_order_relaxed);
  pick->state.store(static_cast<uint32_t>(SwapProgressState::kLoading), std::memory_order_relaxed);
  pick->sequence.store((seq | 1U) + 1, std::memory_order_release);  // even: consistent
  notify_waiters(t.slot_taken);
  return static_cast<uint32_t>(pick - t.slots);
}

void end(SwapProgressTable& t, uint32_t slot, bool finished) {
  if (slot >= kSwapProgressSlots) return;
  SwapProgressSlot& s = t.slots[slot];
  s.state.store(
      static_cast<uint32_t>(finished ? SwapProgressState::kDone : SwapProgressState::kFailed),
      std::memory_order_release);
  if (!finished) {
    // Release GPU streams waiting on any layer of it (their engine learns
    // of the failure from the load's completion).
    const uint32_t generation = s.generation.load(std::memory_order_relaxed);
    for (auto& word : s.layers_done) {
      uint64_t cur = word.load(std::memory_order_acquire);
      while (static_cast<uint32_t>(cur >> 32) == generation &&
             !word.compare_exchange_weak(cur, pack(generation, kReleasedLayers),
                                         std::memory_order_acq_rel)) {
      }
    }
  }
  notify_waiters(s.changed);
}

void publish(SwapProgressTable& t, uint32_t slot, uint32_t generation, uint32_t rank,
             uint32_t layers) {
  if (slot >= kSwapProgressSlots || rank >= kMaxTpSize) return;
  SwapProgressSlot& s = t.slots[slot];
  std::atomic<uint64_t>& word = s.layers_done[rank];
  uint64_t cur = word.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(cur >> 32) != generation) return;  // the slot moved on
    if (static_cast<uint32_t>(cur) >= layers) return;
    if (word.compare_exchange_weak(cur, pack(generation, layers), std::memory_order_acq_rel)) break;
  }
  notify_waiters(s.changed);
}

std::optional<SwapProgressView> read(const SwapProgressTable& t, uint32_t slot) {
  if (slot >= kSwapProgressSlots) return std::nullopt;
  const SwapProgressSlot& s = t.slots[slot];
  for (int attempt = 0; attempt < 64; ++attempt) {
    const uint32_t before = s.sequence.load(std::memory_order_acquire);
    if ((before & 1U) != 0) continue;
    SwapProgressView v;
    v.slot = slot;
    v.generation = s.generation.load(std::memory_order_relaxed);
    v.state = static_cast<SwapProgressState>(s.state.load(std::memory_order_relaxed));
    v.tag = s.tag.load(std::memory_order_relaxed);
    v.first_layer = s.first_layer.load(std::memory_order_relaxed);
    v.layer_count = s.layer_count.load(std::memory_order_relaxed);
    v.handle = s.handle.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.sequence.load(std::memory_order_relaxed) == before) return v;
  }
  return std::nullopt;
}

std::optional<SwapProgressView> find(const SwapProgressTable& t, uint32_t tag) {
  std::optional<SwapProgressView> best;
  for (uint32_t i = 0; i < kSwapProgressSlots; ++i) {
    if (t.slots[i].tag.load(std::memory_order_acquire) != tag) continue;
    std::optional<SwapProgressView> v = read(t, i);
    if (!v || v->tag != tag || v->state == SwapProgressState::kFree) continue;
    if (!best || v->handle > best->handle) best = v;
  }
  return best;
}

std::optional<uint32_t> layers_done(const SwapProgressTable& t, const SwapProgressView& view,
                                    uint32_t rank) {
  if (view.slot >= kSwapProgressSlots || rank >= kMaxTpSize) return std::nullopt;
  const uint64_t w = t.slots[view.slot].layers_done[rank].load(std::memory_order_acquire);
  if (static_cast<uint32_t>(w >> 32) != view.generation) return std::nullopt;
  return static_cast<uint32_t>(w);
}

}  // namespace kvrelay::swap_progress
