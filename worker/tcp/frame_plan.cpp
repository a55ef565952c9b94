#include "worker/tcp/frame_plan.h"

#include <algorithm>

#include "worker/copy_plan.h"

namespace kvrelay::worker::tcp {

void plan_frames(const LayerJob& job, const PoolGeometry& local, uint32_t peer_kv_heads,
                 std::vector<kernels::CopyRun>& scratch, std::vector<PlannedFrame>& out) {
  out.clear();
  const uint32_t layer = job.ticket.layer;
  for (uint32_t slot = 0; slot < local.tensors_per_layer(); ++slot) {
    const PoolTensor tensor = local.tensor_at(slot);  // on the wire by its id
    if (job.share) {
      const uint64_t head = local.block_bytes(tensor) / local.kv_heads;
      to_head_runs(job.runs, local.block_bytes(tensor), head * peer_kv_heads, head, *job.share,
                   scratch);
    } else {
      to_byte_runs(job.runs, local.block_bytes(tensor), scratch);
    }
    for (const kernels::CopyRun& r : scratch) {
      PlannedFrame p;
      p.header.transfer = job.transfer;
      p.header.request_key = job.ticket.request_key;
      p.header.handle = job.ticket.handle;
      p.header.layer = layer;
      p.header.tensor = static_cast<uint32_t>(tensor);
      p.header.dst_offset = r.dst_offset;
      p.header.bytes = r.bytes;
      p.src_offset = r.src_offset;
      out.push_back(p);
    }
  }
  // Only now is the last frame known: a head share of part of a block has a
  // frame per block, more than the job's coalesced runs. (Counting runs once
  // marked a frame in the middle `last`: the receiver acked the transfer
  // before the rest of it had landed.)
  if (!out.empty()) out.back().header.last = true;
}

void group_frames(const std::vector<PlannedFrame>& frames, std::vector<FrameGroup>& out) {
  out.clear();
  for (size_t i = 0; i < frames.size(); ++i) {
    const FrameHeader& f = frames[i].header;
    if (!out.empty()) {
      FrameGroup& g = out.back();
      const FrameHeader& first = frames[g.first].header;
      if (first.transfer == f.transfer && first.layer == f.layer && first.tensor == f.tensor &&
          g.count < kGroupRuns && g.bytes < kGroupBytes && f.bytes <= kGroupBytes - g.bytes) {
        ++g.count;
        g.bytes += f.bytes;
        continue;
      }
    }
    out.push_back(FrameGroup{i, 1, f.bytes});
  }
}

uint64_t append_frames(const std::vector<PlannedFrame>& frames,
                       const std::function<const std::byte*(size_t)>& source, net::Outgoing& out) {
  std::vector<FrameGroup> groups;
  group_frames(frames, groups);
  std::vector<FrameRun> runs;
  uint64_t bytes = 0;
  for (const FrameGroup& group : groups) {
    FrameHeader header = frames[group.first].header;
    runs.clear();
    if (group.count > 1) {
      header.dst_offset = 0;
      header.bytes = group.bytes;
      header.last = frames[group.first + group.count - 1].header.last;
      for (size_t i = group.first; i < group.first + group.count; ++i)
        runs.push_back(FrameRun{frames[i].header.dst_offset, frames[i].header.bytes});
    }
    encode_frame(header, runs, out.owned);
    for (size_t i = group.first; i < group.first + group.count; ++i)
      out.payloads.push_back(
          net::Outgoing::Payload{out.owned.size(), source(i), frames[i].header.bytes,
                                 /*continues=*/i + 1 < group.first + group.count});
    bytes += group.bytes;
  }
  return bytes;
}

void split_to_fit(const PlannedFrame& frame, const PoolGeometry& local, uint64_t limit,
                  std::deque<PlannedFrame>& out) {
  const uint64_t block = local.block_bytes(static_cast<PoolTensor>(frame.header.tensor));
  if (frame.header.bytes <= limit || block == 0 || block > limit) {
    out.push_back(frame);
    return;
  }
  const uint64_t piece_max = limit / block * block;
  for (uint64_t done = 0; done < frame.header.bytes;) {
    PlannedFrame piece = frame;
    piece.header.bytes = std::min(piece_max, frame.header.bytes - done);
    piece.header.dst_offset += done;
    piece.src_offset += done;
    done += piece.header.bytes;
    piece.header.last = frame.header.last && done == frame.header.bytes;
    out.push_back(piece);
  }
}
}  // namespace kvrelay::worker::tcp
