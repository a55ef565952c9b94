// Whether two pools can exchange blocks: the same block shape and layer
// count. Checked when a peer pool is mapped (ipc) and at a transport's
// handshake (tcp, rdma).
#pragma once

#include "instance/pool_geometry.h"
#include "shm/result.h"

namespace kvrelay::worker {

// ok, or kLayoutMismatch naming the first field that differs and both values.
Status check_compatible(const PoolGeometry& local, const PoolGeometry& peer);

}  // namespace kvrelay::worker
