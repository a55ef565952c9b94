// One layer of block runs between two local pools, through a copy engine:
// every tensor of the layer (K, V and, with fp8, their scales) in one batch.
// The ipc transport and the swap engine both move layers this way.
#pragma once

#include <array>
#include <span>
#include <vector>

#include "kernels/copy_engine.h"
#include "worker/copy_plan.h"
#include "worker/local_pool.h"

namespace kvrelay::worker {

// The byte runs of a started copy; must outlive it (until the engine says
// its ticket is done).
struct LayerCopyScratch {
  std::array<std::vector<kernels::CopyRun>, 4> runs;  // per tensor
  std::array<kernels::TensorCopy, 4> batch;
};

struct StartedLayerCopy {
  kernels::CopyTicket ticket;
  uint64_t bytes;
};

// Starts copying `layer` of `runs` (src blocks of `from` -> dst blocks of
// `to`). Refuses pools the engine cannot reach, or a missing layer; block ids
// must have been checked (plan_block_runs).
Result<StartedLayerCopy> start_layer_copy(kernels::CopyEngine& engine, const LocalPool& from,
                                          const LocalPool& to, uint32_t layer,
                                          std::span<const BlockRun> runs,
                                          LayerCopyScratch& scratch);

// After a copy is done: ok, or why its bytes cannot be trusted.
Status check_both_intact(const LocalPool& from, const LocalPool& to);

}  // namespace kvrelay::worker
