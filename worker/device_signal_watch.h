// A rank's GPU-written layer signals (records::kDeviceLayers): the engine's
// stream raises the rank's device signal word as layers are written
// (kernels/stream_signals.h), and the worker turns each layer the word
// passes into the kLayerDone record the engine would have pushed, in order,
// for the scheduler.
//
// While a step's layers are pending the worker reads no further signal
// records: they belong to later steps, and the scheduler follows one batch
// at a time. The word cannot wake a parked process (the GPU makes no
// system call), so the worker polls it while a step is pending: spinning
// while layers keep coming (kSpinAfterProgress), then in short naps.
//
// Single-threaded: the worker's loop owns it.
#pragma once

#include <atomic>
#include <cstdint>

#include "schemas/records.h"

namespace kvrelay::worker {

class DeviceSignalWatch {
 public:
  // Spin (rather than nap) for this long after the word last moved.
  static constexpr uint64_t kSpinAfterProgressNs = 2'000'000;
  // A step may announce at most this many layers (more is a bad record).
  static constexpr uint32_t kMaxLayers = 4096;

  explicit DeviceSignalWatch(const std::atomic<uint64_t>& word) : word_(word) {}

  // Follows the kDeviceLayers record `r`; false (and nothing followed) when
  // it announces more than kMaxLayers layers.
  bool follow(const records::LayerSignal& r, uint64_t now_ns) {
    if (r.count > kMaxLayers) return false;
    step_ = r.step;
    session_ = r.session;
    base_ = r.device_base;
    layers_ = r.count;
    next_ = 0;
    last_progress_ns_ = now_ns;
    return true;
  }
  bool pending() const { return next_ < layers_; }
  // Whether the word moved recently enough to keep spinning on it.
  bool spinning(uint64_t now_ns) const {
    return pending() && now_ns - last_progress_ns_ < kSpinAfterProgressNs;
  }
  // Hands each layer the word has passed to `on_layer` (a kLayerDone
  // record), in order; how many.
  template <class OnLayer>
  uint32_t poll(OnLayer&& on_layer, uint64_t now_ns) {
    if (!pending()) return 0;
    const uint64_t word = word_.load(std::memory_order_acquire);
    uint32_t n = 0;
    while (pending() && word >= base_ + next_ + 1) {
      records::LayerSignal s{};
      s.kind = static_cast<uint32_t>(records::SignalKind::kLayerDone);
      s.step = step_;
      s.layer = next_++;
      s.session = session_;
      on_layer(s);
      ++n;
    }
    if (n > 0) last_progress_ns_ = now_ns;
    return n;
  }
  // An engine session died: its pending step will never be signalled.
  void on_session_ended(uint32_t session) {
    if (pending() && session_ == session) layers_ = next_;
  }
  uint64_t word() const { return word_.load(std::memory_order_relaxed); }

 private:
  const std::atomic<uint64_t>& word_;
  uint64_t step_ = 0;
  uint32_t session_ = 0;
  uint64_t base_ = 0;
  uint32_t layers_ = 0;
  uint32_t next_ = 0;
  uint64_t last_progress_ns_ = 0;
};

}  // namespace kvrelay::worker
