// A pool's shape in a PoolDescriptor, written and read one way: the engine's
// RegisterPool and the tcp transport's hello both carry it.
#pragma once

#include "instance/pool_geometry.h"
#include "schemas/kvrelay.capnp.h"

namespace kvrelay::messages {

// Layers, blocks, heads, block size, head dim, dtype and scales; the rest of
// the descriptor (rank, tier, location) is the caller's.
void set_shape(schema::PoolDescriptor::Builder descriptor, const PoolGeometry& shape);
// The same fields back; values are as sent (compare them, do not trust them).
PoolGeometry shape_of(schema::PoolDescriptor::Reader descriptor);

}  // namespace kvrelay::messages
