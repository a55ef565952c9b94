// The GPU side of the client: layer signals written by the engine's stream,
// and stream waits on swapped-in layers (kvrelay/client.h; the mechanisms:
// kernels/stream_signals.h).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "client/client_impl.h"
#include "instance/swap_progress.h"

namespace kvrelay {

namespace {

Status rank_in_range(const InstanceConfig& c, uint32_t rank) {
  if (rank < c.tp_size) return {};
  return make_error(
      Errc::kInvalidArgument,
      fmt::format("rank {} out of range: the instance has {} ranks", rank, c.tp_size));
}

}  // namespace

Status Client::Impl::pin_shared_pages() {
  if (pinned_shared) return {};
  const auto* status = reinterpret_cast<const std::byte*>(&control.status());
  const auto* table = reinterpret_cast<const std::byte*>(&control.swap_progress());
  const std::byte* begin = std::min(status, table);
  const std::byte* end =
      std::max(status + sizeof(InstanceStatus), table + sizeof(SwapProgressTable));
  Result<kernels::PinnedHostRange> pinned = kernels::PinnedHostRange::pin(
      const_cast<std::byte*>(begin), static_cast<size_t>(end - begin), /*mapped=*/true);
  if (!pinned) return pinned.error();
  pinned_shared = std::move(pinned).value();
  return {};
}

Status Client::own_device_signals(uint32_t rank) {
  if (Status s = rank_in_range(impl_->config, rank); !s) return s;
  if (Status s = own_signals(rank); !s) return s;
  std::lock_guard lock(impl_->device_mu);
  if (impl_->device_writers[rank]) return {};
  if (Status s = impl_->pin_shared_pages(); !s) return s;
  std::atomic<uint64_t>& word = impl_->control.status().device_signals[rank].layers;
  Result<std::unique_ptr<kernels::LayerSignalWriter>> w = kernels::LayerSignalWriter::open(&word);
  if (!w) return w.error();
  // The count goes on from where the word is (a restarted engine's too).
  impl_->device_tally[rank] = word.load(std::memory_order_acquire);
  impl_->device_writers[rank] = std::move(w).value();
  return {};
}

Status Client::push_device_step(uint32_t rank, uint64_t step, std::span<const BatchSlot> slots,
                                uint32_t layers, void* stream, Deadline deadline) {
  if (Status s = own_device_signals(rank); !s) return s;
  const uint32_t total = impl_->config.num_layers + impl_->config.extra_layers;
  if (layers == 0 || layers > total)
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("push_device_step: {} layers; the instance has {}", layers, total));
  std::lock_guard lock(impl_->device_mu);
  const uint64_t base = impl_->device_tally[rank];
  if (Status s = push_batch(rank, step, slots, deadline); !s) return s;
  LayerSignal s{};
  s.kind = static_cast<uint32_t>(records::SignalKind::kDeviceLayers);
  s.step = step;
  s.count = layers;
  s.device_base = base;
  if (Status st = impl_->push(rank, s, deadline); !st) return st;
  impl_->device_tally[rank] = base + layers;
  if (Status st = impl_->device_writers[rank]->begin_step(stream, base); !st) return st;
  return impl_->stream_marks->mark(stream);
}

Status Client::signal_layer(uint32_t rank, uint32_t layer, void* stream) {
  if (Status s = rank_in_range(impl_->config, rank); !s) return s;
  std::lock_guard lock(impl_->device_mu);
  if (!impl_->device_writers[rank])
    return make_error(Errc::kInvalidArgument,
                      fmt::format("rank {}: call own_device_signals or push_device_step before "
                                  "signal_layer",
                                  rank));
  if (Status s = impl_->device_writers[rank]->signal_layer(stream, layer); !s) return s;
  return impl_->stream_marks->mark(stream);
}

Status Client::stream_wait_layer(std::string_view request_id, uint32_t layer, void* stream,
                                 Deadline deadline, std::optional<uint32_t> rank) {
  if (rank)
    if (Status s = rank_in_range(impl_->config, *rank); !s) return s;
  SwapProgressTable& table = impl_->control.swap_progress();
  {
    std::lock_guard lock(impl_->device_mu);
    if (Status s = impl_->pin_shared_pages(); !s) return s;
    if (!impl_->pinned_progress) {
      Result<kernels::PinnedHostRange> pinned =
          kernels::PinnedHostRange::pin(&table, sizeof(table), /*mapped=*/true);
      if (!pinned) return pinned.error();
      impl_->pinned_progress = std::move(pinned).value();
      impl_->device_waits_used.store(true, std::memory_order_release);
    }
  }
  Result<SwapProgressView> load = impl_->find_load(request_id, layer, deadline);
  if (!load) return load.error();
  // Each rank's count is generation << 32 | layers: a later load's
  // generation is larger and ends the wait too, as a failure's release does.
  const uint64_t need = (uint64_t{load->generation} << 32) | (layer - load->first_layer + 1);
  for (uint32_t r = 0; r < impl_->config.tp_size; ++r) {
    if (rank && r != *rank) continue;
    if (Status s = kernels::stream_wait_at_least(stream, *impl_->pinned_progress,
                                                 &table.slots[load->slot].layers_done[r], need);
        !s)
      return s;
  }
  return impl_->stream_marks->mark(stream);
}

namespace {

// How long a client's teardown waits for the engine's streams to be done
// with its device side before keeping that side instead.
constexpr auto kRetireWait = std::chrono::seconds(2);

// A device side an engine stream may still use (a pending stream wait, a
// signal kernel not yet run): its writers, its pinned pages and the mapping
// they point into, kept until the process exits. Freeing them under the
// stream would be an illegal address, sticky in the engine's CUDA context.
struct KeptDeviceSide {
  ControlSegment control;
  std::optional<kernels::PinnedHostRange> pinned_shared;  // unpinned last, were it ever
  std::array<std::unique_ptr<kernels::LayerSignalWriter>, kMaxTpSize> writers;
  std::optional<kernels::PinnedHostRange> pinned_progress;
};

void keep_for_process_life(std::unique_ptr<KeptDeviceSide> side) {
  static std::mutex mu;
  // Never destroyed, not even at exit: the CUDA driver may be gone by then.
  static auto* kept = new std::vector<std::unique_ptr<KeptDeviceSide>>();
  std::lock_guard lock(mu);
  kept->push_back(std::move(side));
}

}  // namespace

void Client::Impl::retire_device_side() {
  std::lock_guard lock(device_mu);
  const bool used = pinned_shared.has_value() || pinned_progress.has_value() ||
                    std::any_of(device_writers.begin(), device_writers.end(),
                                [](const auto& w) { return w != nullptr; });
  if (!used) return;
  // A coordinator that is gone ends nobody's loads: this process's stream
  // waits are released first, as at a failure, so its streams can finish.
  if (coordinator.lock_state() == LockState::kFree) release_device_waits();
  // The client's own marks, never the engine's streams: the engine may have
  // destroyed them already (kernels/stream_marks.h).
  if (stream_marks->done_within(kRetireWait)) return;  // nothing queued uses the members any more
  keep_for_process_life(std::unique_ptr<KeptDeviceSide>(
      new KeptDeviceSide{std::move(control), std::move(pinned_shared), std::move(device_writers),
                         std::move(pinned_progress)}));
  pinned_progress.reset();
  pinned_shared.reset();
}

}  // namespace kvrelay
