// The shape of one rank's KV pool (DESIGN.md section 6): num_layers (plus
// speculative extra layers) x {K, V[, K scale, V scale]} tensors of shape
// [num_blocks, kv_heads, block_size, head_dim]; scales are float32
// [num_blocks, kv_heads, block_size]. Extra layers hold extra_layer_blocks
// blocks each.
//
// Part of kvrelay's public face (self-contained). The same struct is stored
// in every pool segment's header, hence the fixed-width fields.
#pragma once

#include <cstdint>

#include "kvrelay/types.h"

namespace kvrelay {

struct PoolGeometry {
  uint32_t num_layers = 0;
  uint32_t extra_layers = 0;
  uint32_t num_blocks = 0;
  uint32_t extra_layer_blocks = 0;
  uint32_t kv_heads = 0;
  uint32_t block_size = 0;  // tokens
  uint32_t head_dim = 0;
  uint32_t dtype = 0;       // CacheDtype
  uint32_t has_scales = 0;  // 1: K and V scale tensors follow V in each layer
  uint32_t reserved = 0;

  uint32_t total_layers() const { return num_layers + extra_layers; }
  uint32_t tensors_per_layer() const { return has_scales ? 4 : 2; }
  uint32_t blocks_in_layer(uint32_t layer) const {
    return layer < num_layers ? num_blocks : extra_layer_blocks;
  }
  // Bytes of one block of one tensor.
  uint64_t block_bytes(PoolTensor t) const {
    const uint64_t cells = uint64_t{kv_heads} * block_size;
    if (t == PoolTensor::kKeyScale || t == PoolTensor::kValueScale) return cells * 4;
    return cells * head_dim * dtype_bytes(static_cast<CacheDtype>(dtype));
  }
  uint64_t tensor_bytes(uint32_t layer, PoolTensor t) const {
    return uint64_t{blocks_in_layer(layer)} * block_bytes(t);
  }
  bool operator==(const PoolGeometry&) const = default;
};
static_assert(sizeof(PoolGeometry) == 40);

}  // namespace kvrelay
