// How one layer job of the tcp transport is cut into frames: a frame per
// coalesced run of each tensor (or, for a head share of part of a block, per
// block), and, for a GPU pool, into pieces that fit a staging slot.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "instance/pool_geometry.h"
#include "kernels/block_copy.h"
#include "worker/net/peer_plan.h"
#include "worker/tcp/frame_wire.h"

namespace kvrelay::worker::tcp {

using net::LayerJob;

// One frame of a layer job over tcp: its header, and where its payload
// starts in the local pool's tensor `header.tensor`.
struct PlannedFrame {
  FrameHeader header;
  uint64_t src_offset = 0;
};

// Every frame of `job` (its transfer id already set), for a local pool of
// `local` and a receiver with `peer_kv_heads` per block: a frame per
// coalesced run of each tensor, or with a head share of part of a block, a
// frame per block; the last one marked `last` (the receiver acks the
// transfer there). `scratch` keeps its capacity from job to job.
void plan_frames(const LayerJob& job, const PoolGeometry& local, uint32_t peer_kv_heads,
                 std::vector<kernels::CopyRun>& scratch, std::vector<PlannedFrame>& out);

// Appends `frame` to `out` as frames of at most `limit` payload bytes each
// (a staging slot; at least one block of `local`), split at whole blocks:
// what a receiver accepts. Only the final piece keeps `last`. A frame of a
// head share lies within one block and is never split.
void split_to_fit(const PlannedFrame& frame, const PoolGeometry& local, uint64_t limit,
                  std::deque<PlannedFrame>& out);

}  // namespace kvrelay::worker::tcp
