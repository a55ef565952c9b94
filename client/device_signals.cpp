// The GPU side of the client: layer signals written by the engine's stream,
// and stream waits on swapped-in layers (kvrelay/client.h; the mechanisms:
// kernels/stream_signals.h).
#include <fmt/format.h>

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

Status Client::own_device_signals(uint32_t rank) {
  if (Status s = rank_in_range(impl_->config, rank); !s) return s;
  if (Status s = own_signals(rank); !s) return s;
  std::lock_guard lock(impl_->device_mu);
  if (impl_->device_writers[rank]) return {};
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
  return impl_->device_writers[rank]->begin_step(stream, base);
}

Status Client::signal_layer(uint32_t rank, uint32_t layer, void* stream) {
  if (Status s = rank_in_range(impl_->config, rank); !s) return s;
  std::lock_guard lock(impl_->device_mu);
  if (!impl_->device_writers[rank])
    return make_error(Errc::kInvalidArgument,
                      fmt::format("rank {}: call own_device_signals or push_device_step before "
                                  "signal_layer",
                                  rank));
  return impl_->device_writers[rank]->signal_layer(stream, layer);
}

Status Client::stream_wait_layer(std::string_view request_id, uint32_t layer, void* stream,
                                 Deadline deadline, std::optional<uint32_t> rank) {
  if (rank)
    if (Status s = rank_in_range(impl_->config, *rank); !s) return s;
  SwapProgressTable& table = impl_->control.swap_progress();
  {
    std::lock_guard lock(impl_->device_mu);
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
  return {};
}

}  // namespace kvrelay
