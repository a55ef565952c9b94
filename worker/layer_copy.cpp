#include "worker/layer_copy.h"

#include <fmt/format.h>

namespace kvrelay::worker {

Result<StartedLayerCopy> start_layer_copy(kernels::CopyEngine& engine, const LocalPool& from,
                                          const LocalPool& to, uint32_t layer,
                                          std::span<const BlockRun> runs,
                                          LayerCopyScratch& scratch) {
  for (const LocalPool* pool : {&from, &to}) {
    if (!engine.reaches(pool->memory_kind()))
      return make_error(
          Errc::kInvalidArgument,
          fmt::format("pool {} is {} memory, which the {} copy engine cannot reach", pool->name(),
                      kernels::memory_kind_name(pool->memory_kind()), engine.name()));
  }
  const PoolGeometry& g = from.geometry();
  const uint32_t tensors = g.tensors_per_layer();
  uint64_t bytes = 0;
  for (uint32_t t = 0; t < tensors; ++t) {
    const auto tensor = static_cast<PoolTensor>(t);
    const std::byte* src = from.tensor(layer, tensor);
    std::byte* dst = to.tensor(layer, tensor);
    if (src == nullptr || dst == nullptr)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("layer {} tensor {} does not exist", layer, t));
    to_byte_runs(runs, g.block_bytes(tensor), scratch.runs[t]);
    bytes += kernels::run_bytes(scratch.runs[t]);
    scratch.batch[t] = kernels::TensorCopy{src, dst, scratch.runs[t]};
  }
  const kernels::CopyTicket ticket =
      engine.submit(std::span<const kernels::TensorCopy>(scratch.batch.data(), tensors));
  return StartedLayerCopy{ticket, bytes};
}

Status check_both_intact(const LocalPool& from, const LocalPool& to) {
  // A pool truncated under us reads and writes zeros: the copy is garbage.
  if (Status s = from.check_intact(); !s) return s;
  return to.check_intact();
}

}  // namespace kvrelay::worker
