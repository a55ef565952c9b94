// The client's public views (kvrelay/instance_info.h, kvrelay/pool_view.h)
// made from kvrelay's own types. Internal to the library.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "instance/instance_config.h"
#include "instance/pool_segment.h"
#include "kvrelay/instance_info.h"
#include "kvrelay/pool_view.h"

namespace kvrelay {

// A copy of `config` in the public types.
InstanceInfo instance_info_of(const InstanceConfig& config);

// Hands `pool`'s mapping over to a view.
PoolView pool_view_of(HostPool pool);
// A view of tensors mapped some other way (`tensors` layer-major), kept
// mapped by `owner` (tests: an engine's memfd pool).
PoolView pool_view_of(const PoolGeometry& geometry, std::vector<std::byte*> tensors,
                      std::shared_ptr<void> owner, std::string name, uint32_t rank);

}  // namespace kvrelay
