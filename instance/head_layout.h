// How a model's KV heads are spread over the tensor-parallel ranks of one
// instance, and which of them a prefill rank sends to which decode rank when
// the two instances' TP sizes differ (heterogeneous TP).
//
// An instance of `tp` ranks holding `heads_per_rank` KV heads each serves a
// model of `total_heads` KV heads in one of two ways, as the engines do:
//   - split:      heads_per_rank * tp == total_heads; rank r holds heads
//                 [r * heads_per_rank, (r + 1) * heads_per_rank);
//   - replicated: fewer KV heads than ranks (GQA, e.g. 8 heads at tp 16):
//                 heads_per_rank == 1 and tp is a multiple of total_heads;
//                 rank r holds head r / (tp / total_heads), so each head has
//                 tp / total_heads replicas on consecutive ranks.
//
// Pools are laid out [blocks, kv_heads, block_size, head_dim], so a range of
// a rank's heads within one block is one contiguous run of bytes.
#pragma once

#include <cstdint>
#include <vector>

#include "instance/instance_config.h"
#include "shm/result.h"

namespace kvrelay {

struct HeadLayout {
  uint32_t tp_size = 1;
  uint32_t heads_per_rank = 1;
  uint32_t total_heads = 1;

  // ok, or why these three numbers describe no way to spread the heads.
  Status check() const;
  // Ranks holding each head: 1 when split.
  uint32_t replicas() const { return tp_size > total_heads ? tp_size / total_heads : 1; }
  // The first (model) head rank `rank` holds; it holds heads_per_rank of them.
  uint32_t first_head(uint32_t rank) const {
    return tp_size > total_heads ? rank / replicas() : rank * heads_per_rank;
  }
  bool operator==(const HeadLayout&) const = default;
};

// The instance's layout: total_kv_heads, or kv_heads * tp_size where that
// is 0 (the split layout, the only one before heterogeneous TP).
HeadLayout head_layout_of(const InstanceConfig& config);

// A range of heads that one prefill rank sends to one decode rank: its heads
// [src_head, src_head + heads) (indices within the prefill rank's pool) go
// to [dst_head, dst_head + heads) of the decode rank's pool.
struct HeadShare {
  uint32_t decode_rank = 0;
  uint32_t src_head = 0;
  uint32_t dst_head = 0;
  uint32_t heads = 0;
  bool operator==(const HeadShare&) const = default;
};

// What prefill rank `prefill_rank` sends, by decode rank (ascending), one
// share per contiguous head range. Every head of every decode rank comes
// from exactly one prefill rank: where the prefill side replicates a head,
// decode rank d takes it from replica d % replicas, which spreads the
// sending over the replicas. Both layouts must have passed check() with the
// same total_heads. Same layouts: each rank sends all its heads to itself.
std::vector<HeadShare> head_shares(const HeadLayout& prefill, uint32_t prefill_rank,
                                   const HeadLayout& decode);

// The decode ranks' view: how many prefill ranks send to `decode_rank`.
uint32_t senders_of(const HeadLayout& prefill, const HeadLayout& decode, uint32_t decode_rank);

}  // namespace kvrelay
