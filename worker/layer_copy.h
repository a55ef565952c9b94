// One layer of block runs from a local pool, through a copy engine: every
// tensor of the layer (K, V and, with fp8, their scales) in one batch, into
// one pool or, for heterogeneous TP, a head range of each of several pools.
// The ipc transport and the swap engine both move layers this way.
#pragma once

#include <span>
#include <vector>

#include "instance/head_layout.h"
#include "kernels/copy_engine.h"
#include "worker/copy_plan.h"
#include "worker/local_pool.h"

namespace kvrelay::worker {

// The byte runs of a started copy; must outlive it (until the engine says
// its ticket is done). Kept between copies: no allocation per layer once
// warm.
struct LayerCopyScratch {
  std::vector<std::vector<kernels::CopyRun>> runs;  // per (target, tensor)
  std::vector<kernels::TensorCopy> batch;
};

// Where a layer goes: a pool and, for heterogeneous TP, which heads.
struct CopyTarget {
  const LocalPool* pool = nullptr;
  const HeadShare* share = nullptr;  // null: whole blocks (both sides hold the same heads)
};

struct StartedLayerCopy {
  kernels::CopyTicket ticket;
  uint64_t bytes;
};

// Starts copying `layer` of `runs` (src blocks of `from` -> dst blocks of
// each target) as one batch, so one ticket covers every target. Refuses
// pools the engine cannot reach, a missing layer, or a head range outside a
// pool; block ids must have been checked (plan_block_runs).
Result<StartedLayerCopy> start_layer_copy(kernels::CopyEngine& engine, const LocalPool& from,
                                          std::span<const CopyTarget> targets, uint32_t layer,
                                          std::span<const BlockRun> runs, LayerCopyScratch& scratch,
                                          bool read_soon = false);
// The same into one pool, whole blocks. `read_soon`: this host's CPUs read
// the destination next (kernels::TensorCopy::read_soon).
Result<StartedLayerCopy> start_layer_copy(kernels::CopyEngine& engine, const LocalPool& from,
                                          const LocalPool& to, uint32_t layer,
                                          std::span<const BlockRun> runs, LayerCopyScratch& scratch,
                                          bool read_soon = false);

// After a copy is done: ok, or why its bytes cannot be trusted.
Status check_both_intact(const LocalPool& from, const LocalPool& to);

}  // namespace kvrelay::worker
