// Whether two pools can exchange blocks: the same block shape and layer
// count. Checked when a peer pool is mapped (ipc) and at a transport's
// handshake (tcp, rdma).
#pragma once

#include "instance/head_layout.h"
#include "instance/pool_geometry.h"
#include "shm/result.h"

namespace kvrelay::worker {

// ok, or kLayoutMismatch naming the first field that differs and both values.
Status check_compatible(const PoolGeometry& local, const PoolGeometry& peer);

// The same for instances whose TP sizes may differ (heterogeneous TP): the
// model's KV heads in all must match, not each rank's, and each pool must
// hold as many heads as its instance's layout gives a rank.
Status check_compatible(const PoolGeometry& local, const HeadLayout& local_heads,
                        const PoolGeometry& peer, const HeadLayout& peer_heads);

}  // namespace kvrelay::worker
