// The client's public views (kvrelay/instance_info.h, kvrelay/pool_view.h)
// made from kvrelay's own types. Internal to the library.
#pragma once

#include "instance/instance_config.h"
#include "instance/pool_segment.h"
#include "kvrelay/instance_info.h"
#include "kvrelay/pool_view.h"

namespace kvrelay {

// A copy of `config` in the public types.
InstanceInfo instance_info_of(const InstanceConfig& config);

// Hands `pool`'s mapping over to a view.
PoolView pool_view_of(HostPool pool);

}  // namespace kvrelay
