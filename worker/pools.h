// A worker's own pools: the rank's device pool and, with a host tier, its
// host pool, each a shared-memory segment the worker holds the owner lock of
// for its life. A restarted worker reopens its rank's pools (the engine's KV
// data survives); a pool whose geometry changed is replaced; a pool that
// belongs to another user, or that a live process holds, is never touched.
#pragma once

#include <memory>

#include "instance/control_segment.h"
#include "instance/pool_segment.h"
#include "worker/local_pool.h"

namespace kvrelay::worker {

// Opens this rank's pool of `tier` if a compatible one exists, else creates
// it; then publishes it in the instance's pool directory.
Result<std::unique_ptr<LocalPool>> open_or_create_pool(const ControlSegment& control, uint32_t rank,
                                                       PoolTier tier);

}  // namespace kvrelay::worker
