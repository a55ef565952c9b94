#include "worker/layer_copy.h"

#include <fmt/format.h>

namespace kvrelay::worker {

namespace {

Status reachable(const kernels::CopyEngine& engine, const LocalPool& pool) {
  if (engine.reaches(pool.memory_kind())) return {};
  return make_error(
      Errc::kInvalidArgument,
      fmt::format("pool {} is {} memory, which the {} copy engine cannot reach", pool.name(),
                  kernels::memory_kind_name(pool.memory_kind()), engine.name()));
}

Status share_fits(const HeadShare& share, const LocalPool& from, const LocalPool& to) {
  if (uint64_t{share.src_head} + share.heads <= from.geometry().kv_heads &&
      uint64_t{share.dst_head} + share.heads <= to.geometry().kv_heads && share.heads > 0)
    return {};
  return make_error(Errc::kInvalidArgument,
                    fmt::format("heads [{}, +{}) -> [{}, +{}) do not fit pools of {} and {} heads "
                                "per block",
                                share.src_head, share.heads, share.dst_head, share.heads,
                                from.geometry().kv_heads, to.geometry().kv_heads));
}

}  // namespace

Result<StartedLayerCopy> start_layer_copy(kernels::CopyEngine& engine, const LocalPool& from,
                                          std::span<const CopyTarget> targets, uint32_t layer,
                                          std::span<const BlockRun> runs, LayerCopyScratch& scratch,
                                          bool read_soon) {
  if (Status s = reachable(engine, from); !s) return s.error();
  const PoolGeometry& g = from.geometry();
  const uint32_t tensors = g.tensors_per_layer();
  if (scratch.runs.size() < targets.size() * tensors) scratch.runs.resize(targets.size() * tensors);
  scratch.batch.clear();
  uint64_t bytes = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    const LocalPool& to = *targets[i].pool;
    if (Status s = reachable(engine, to); !s) return s.error();
    if (targets[i].share != nullptr)
      if (Status s = share_fits(*targets[i].share, from, to); !s) return s.error();
    for (uint32_t t = 0; t < tensors; ++t) {
      const PoolTensor tensor = g.tensor_at(t);
      const std::byte* src = from.tensor(layer, tensor);
      std::byte* dst = to.tensor(layer, tensor);
      if (src == nullptr || dst == nullptr)
        return make_error(Errc::kInvalidArgument,
                          fmt::format("layer {} tensor {} does not exist", layer,
                                      tensor_name(tensor)));
      std::vector<kernels::CopyRun>& out = scratch.runs[i * tensors + t];
      if (targets[i].share == nullptr) {
        to_byte_runs(runs, g.block_bytes(tensor), out);
      } else {
        to_head_runs(runs, g.block_bytes(tensor), to.geometry().block_bytes(tensor),
                     g.block_bytes(tensor) / g.kv_heads, *targets[i].share, out);
      }
      bytes += kernels::run_bytes(out);
      scratch.batch.push_back(
          kernels::TensorCopy{src, dst, out, from.memory_kind(), to.memory_kind(), read_soon});
    }
  }
  Result<kernels::CopyTicket> ticket = engine.submit(scratch.batch);
  if (!ticket) return ticket.error();
  return StartedLayerCopy{*ticket, bytes};
}

Result<StartedLayerCopy> start_layer_copy(kernels::CopyEngine& engine, const LocalPool& from,
                                          const LocalPool& to, uint32_t layer,
                                          std::span<const BlockRun> runs, LayerCopyScratch& scratch,
                                          bool read_soon) {
  const CopyTarget target{&to, nullptr};
  return start_layer_copy(engine, from, std::span<const CopyTarget>(&target, 1), layer, runs,
                          scratch, read_soon);
}

Status check_both_intact(const LocalPool& from, const LocalPool& to) {
  // A pool truncated under us reads and writes zeros: the copy is garbage.
  if (Status s = from.check_intact(); !s) return s;
  return to.check_intact();
}

}  // namespace kvrelay::worker
