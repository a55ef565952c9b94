// The pool both data-plane fuzzers check against: two layer kinds (an extra
// layer with fewer blocks) and fp8-style scales, so every shape rule runs.
#pragma once

#include "instance/pool_geometry.h"

namespace kvrelay::fuzz {

inline PoolGeometry fuzz_geometry() {
  PoolGeometry g;
  g.num_layers = 4;
  g.extra_layers = 1;
  g.num_blocks = 64;
  g.extra_layer_blocks = 16;
  g.kv_heads = 2;
  g.block_size = 16;
  g.head_dim = 64;
  g.dtype = 0;
  g.has_scales = 1;
  return g;
}

}  // namespace kvrelay::fuzz
