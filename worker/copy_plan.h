// Copy planning: which bytes move for one layer of a block range.
//
// Block ids pair up by position (src[i] -> dst[i]). Where both sides are
// consecutive (src[i+1] == src[i] + 1 and dst[i+1] == dst[i] + 1) the blocks
// coalesce into one run (DESIGN.md section 5, point 7), so a request whose
// blocks were allocated contiguously on both sides moves as one memcpy per
// tensor. Every id is checked against its pool's block count for that layer
// before a single byte moves.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "instance/head_layout.h"
#include "kernels/block_copy.h"
#include "shm/result.h"

namespace kvrelay::worker {

// A run of `count` consecutive blocks: src_block.. -> dst_block..
struct BlockRun {
  uint32_t src_block;
  uint32_t dst_block;
  uint32_t count;
};

// Coalesces src[i] -> dst[i]. Checks every id (< src_blocks, < dst_blocks);
// the error names the id, the pool's size, the rank and the layer.
Result<std::vector<BlockRun>> plan_block_runs(std::span<const uint32_t> src,
                                              std::span<const uint32_t> dst, uint32_t src_blocks,
                                              uint32_t dst_blocks, uint32_t rank, uint32_t layer);
// The same into `runs` (cleared first), which keeps its capacity: the hot
// path plans every layer into one buffer and allocates nothing once warm.
Status plan_block_runs(std::span<const uint32_t> src, std::span<const uint32_t> dst,
                       uint32_t src_blocks, uint32_t dst_blocks, uint32_t rank, uint32_t layer,
                       std::vector<BlockRun>& runs);

// The byte runs of one tensor, for blocks of `block_bytes` bytes each.
void to_byte_runs(std::span<const BlockRun> runs, uint64_t block_bytes,
                  std::vector<kernels::CopyRun>& out);

// The byte runs of one tensor for the head range `share` (heterogeneous TP):
// blocks are [kv_heads, ...] of `head_bytes` each, so the range is one run
// per block, and runs of consecutive blocks are not adjacent unless the
// range is every head on both sides (then as to_byte_runs).
void to_head_runs(std::span<const BlockRun> runs, uint64_t src_block_bytes,
                  uint64_t dst_block_bytes, uint64_t head_bytes, const HeadShare& share,
                  std::vector<kernels::CopyRun>& out);

}  // namespace kvrelay::worker
