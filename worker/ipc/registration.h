// The ipc transport's row of the registry (transport_registry.h).
#pragma once

#include "worker/transport_registry.h"

namespace kvrelay::worker::ipc {

Result<BuiltTransport> build(TransportContext& context);

}  // namespace kvrelay::worker::ipc
