// How one layer job of the tcp transport is cut into frames: a frame per
// coalesced run of each tensor (or, for a head share of part of a block, per
// block), and, for a GPU pool, into pieces that fit a staging slot.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "instance/pool_geometry.h"
#include "kernels/block_copy.h"
#include "worker/net/channel.h"
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

// Frames a sender gathers into one frame of several runs (one envelope, one
// tag, one check at the receiver for many scattered blocks): at most this
// many runs, of this many bytes in all.
inline constexpr size_t kGroupRuns = 256;
inline constexpr uint64_t kGroupBytes = 1u << 20;

// Consecutive planned frames sent as one: frames [first, first + count),
// `bytes` in all.
struct FrameGroup {
  size_t first = 0;
  size_t count = 0;
  uint64_t bytes = 0;
};
// Groups consecutive frames of one transfer's tensor, up to kGroupRuns runs
// and kGroupBytes (a frame larger than that stays alone).
void group_frames(const std::vector<PlannedFrame>& frames, std::vector<FrameGroup>& out);

// Appends `frames` to `out` grouped (group_frames): each group's envelope
// (a lone frame as planned, else a frame of its runs) and its payload, one
// record gathered from where `source(i)` says frame i's bytes are. Returns
// the payload bytes.
uint64_t append_frames(const std::vector<PlannedFrame>& frames,
                       const std::function<const std::byte*(size_t)>& source, net::Outgoing& out);

// Appends `frame` to `out` as frames of at most `limit` payload bytes each
// (a staging slot; at least one block of `local`), split at whole blocks:
// what a receiver accepts. Only the final piece keeps `last`. A frame of a
// head share lies within one block and is never split.
void split_to_fit(const PlannedFrame& frame, const PoolGeometry& local, uint64_t limit,
                  std::deque<PlannedFrame>& out);

}  // namespace kvrelay::worker::tcp
