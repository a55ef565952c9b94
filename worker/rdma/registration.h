// The rdma transport's row of the registry (transport_registry.h): the
// rank's RDMA device and its pool's registration (made once, shared by both
// sides), its sender (rdma_transport.h), and its listener's session handler
// (session_handler.h) on the rank's --rdma-ports port and on its tcp
// listener too.
#pragma once

#include "worker/transport_registry.h"

namespace kvrelay::worker::rdma {

uint16_t listen_port(const InstanceConfig& config, uint32_t rank);
Result<BuiltTransport> build(TransportContext& context);

}  // namespace kvrelay::worker::rdma
