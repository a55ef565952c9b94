// A verifiable KV pattern: every 8-byte word of every block is a function of
// (request, layer, tensor, block index in the request, rank, word), so the
// decode side can check each byte it received and tell exactly which block
// went wrong. Used by kvrelay-sim and by the tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvrelay/pool_view.h"

namespace kvrelay::sim {

struct BlockTag {
  uint64_t request;  // the engine's numeric request tag
  uint32_t layer;
  uint32_t tensor;  // PoolTensor
  uint32_t index;   // position of the block in the request's block table
  uint32_t rank;
};

// The ids (PoolTensor values) of the tensors a pool of `g` has, in their
// order in a layer: K, V, K scale, V scale, less what a K-only pool lacks.
inline std::vector<uint32_t> tensor_ids(const PoolGeometry& g) {
  std::vector<uint32_t> ids;
  for (uint32_t slot = 0; slot < g.tensors_per_layer(); ++slot)
    ids.push_back(static_cast<uint32_t>(g.tensor_at(slot)));
  return ids;
}

// Writes the pattern of `tag` into one block of `pool`. False if the block
// does not exist.
bool fill_block(const PoolView& pool, uint32_t block_id, const BlockTag& tag);
// Checks one block. Returns the number of wrong 8-byte words (0: intact).
uint64_t check_block(const PoolView& pool, uint32_t block_id, const BlockTag& tag);
// Fills a block with a constant "never written" marker, and checks for it:
// the verification that nothing outside a request's destinations was touched.
void poison_block(const PoolView& pool, uint32_t layer, uint32_t tensor, uint32_t block_id);
bool block_is_poisoned(const PoolView& pool, uint32_t layer, uint32_t tensor, uint32_t block_id);

}  // namespace kvrelay::sim

namespace kvrelay::sim {

// A request's blocks on both sides: block i of the request is src[i] on the
// prefill side; the decode side holds the first src.size() - dst.size()
// already (prefix cache), so dst[j] receives block prefix + j.
struct RequestBlocks {
  uint64_t tag = 0;
  std::vector<uint32_t> src;
  std::vector<uint32_t> dst;
  uint32_t prefix() const { return static_cast<uint32_t>(src.size() - dst.size()); }
};

// Writes the pattern of every block, layer and tensor of `r` into `pool`
// (the prefill pool of `rank`).
void fill_request(const PoolView& pool, uint32_t rank, const RequestBlocks& r);
// Wrong 8-byte words over every destination block, layer and tensor of `r`
// in `pool` (the decode pool of `rank`). 0: every byte arrived.
uint64_t check_request(const PoolView& pool, uint32_t rank, const RequestBlocks& r);


// The same, head by head (tag.rank is ignored): each head's bytes follow the model KV head they
// hold, not the rank, so a decode block assembled from several prefill
// ranks' heads (heterogeneous TP) checks out. `first_head`: the model head
// that head 0 of the pool holds (InstanceInfo::first_kv_head).
void fill_block_heads(const PoolView& pool, uint32_t block_id, const BlockTag& tag,
                      uint32_t first_head);
// Wrong 8-byte words (a head's last word may be shorter) of one block.
uint64_t check_block_heads(const PoolView& pool, uint32_t block_id, const BlockTag& tag,
                           uint32_t first_head);
void fill_request_heads(const PoolView& pool, uint32_t first_head, const RequestBlocks& r);
void fill_blocks_heads(const PoolView& pool, uint32_t first_head, const RequestBlocks& r,
                       uint32_t layer, uint32_t first, uint32_t last);
uint64_t check_request_heads(const PoolView& pool, uint32_t first_head, const RequestBlocks& r);

}  // namespace kvrelay::sim
