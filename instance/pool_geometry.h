// The shape of one rank's KV pool (the public struct: kvrelay/pool_geometry.h)
// as an instance's configuration decides it.
#pragma once

#include "instance/instance_config.h"
#include "kvrelay/pool_geometry.h"

namespace kvrelay {

// The device tier has num_blocks blocks, the host tier host_blocks.
inline PoolGeometry pool_geometry_of(const InstanceConfig& c, PoolTier tier) {
  PoolGeometry g;
  g.num_layers = c.num_layers;
  g.extra_layers = c.extra_layers;
  g.num_blocks = tier == PoolTier::kHost ? c.host_blocks : c.num_blocks;
  g.extra_layer_blocks =
      c.extra_layers > 0 ? (tier == PoolTier::kHost ? c.host_blocks : c.extra_layer_blocks) : 0;
  g.kv_heads = c.kv_heads;
  g.block_size = c.block_size;
  g.head_dim = c.head_dim;
  g.dtype = c.dtype;
  g.has_scales = c.has_scales;
  g.k_only = c.k_only;
  return g;
}

}  // namespace kvrelay
