// The tcp transport's row of the registry (transport_registry.h): its
// sender (tcp_transport.h), its listener's frame handler (frame_receiver.h)
// on the rank's --tcp-ports port, and staging for a GPU pool (staging.h).
#pragma once

#include "worker/transport_registry.h"

namespace kvrelay::worker::tcp {

uint16_t listen_port(const InstanceConfig& config, uint32_t rank);
Result<BuiltTransport> build(TransportContext& context);

}  // namespace kvrelay::worker::tcp
