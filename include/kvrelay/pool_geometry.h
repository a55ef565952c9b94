// The shape of one rank's KV pool (DESIGN.md section 6): num_layers (plus
// speculative extra layers) x {K, V[, K scale, V scale]} tensors of shape
// [num_blocks, kv_heads, block_size, head_dim]; scales are float32
// [num_blocks, kv_heads, block_size]. Extra layers hold extra_layer_blocks
// blocks each.
//
// A K-only pool (k_only) has no V: one tensor per layer, plus its K scale
// where there are scales. That is a multi-head latent attention (MLA) cache:
// each token's compressed latent and RoPE key, one "head" replicated on
// every rank. Opaque per-token formats (FlashMLA's fp8: 656 bytes a token)
// are the uint8 dtype with head_dim = bytes per token.
//
// Tensors are named by PoolTensor everywhere (the wire, the APIs); a layer
// stores the tensors its pool has in the order K, V, K scale, V scale, and
// slot_of / tensor_at convert between a tensor and its place in that order.
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
  uint32_t k_only = 0;      // 1: no V (an MLA latent cache)

  uint32_t total_layers() const { return num_layers + extra_layers; }
  uint32_t tensors_per_layer() const { return (k_only != 0 ? 1 : 2) * (has_scales != 0 ? 2 : 1); }
  bool has_tensor(PoolTensor t) const {
    switch (t) {
      case PoolTensor::kKey: return true;
      case PoolTensor::kValue: return k_only == 0;
      case PoolTensor::kKeyScale: return has_scales != 0;
      case PoolTensor::kValueScale: return has_scales != 0 && k_only == 0;
    }
    return false;
  }
  // Whether a tensor id from outside (a wire, an API) names one of this pool's.
  bool has_tensor_id(uint32_t id) const { return id < 4 && has_tensor(static_cast<PoolTensor>(id)); }
  // The tensor at `slot` (0 .. tensors_per_layer() - 1) of a layer.
  PoolTensor tensor_at(uint32_t slot) const {
    if (k_only == 0) return static_cast<PoolTensor>(slot);
    return slot == 0 ? PoolTensor::kKey : PoolTensor::kKeyScale;
  }
  // The slot of one of this pool's tensors (has_tensor(t)).
  uint32_t slot_of(PoolTensor t) const {
    if (k_only == 0) return static_cast<uint32_t>(t);
    return t == PoolTensor::kKey ? 0 : 1;
  }
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
