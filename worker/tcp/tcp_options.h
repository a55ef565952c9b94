// The tcp transport's flags, declared here once for both programs
// (transport_options.h): kvrelay-coordinator checks them and hands them on,
// kvrelay-worker reads them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "instance/instance_config.h"
#include "shm/result.h"
#include "worker/net/net_options.h"

namespace CLI {
class App;
}

namespace kvrelay::worker::tcp {

struct TcpOptions {
  uint32_t lanes = 2;  // parallel connections per decode rank a prefill rank sends to
  // A GPU pool over tcp: each connection stages payloads through two
  // page-locked slots of this many MiB (at least a block).
  uint32_t staging_slot_mib = 8;
};

void declare_options(CLI::App& app, TcpOptions& options);
// A rank that listens (--tcp-ports, not prefill-only) needs the key.
Status settle_options(const InstanceConfig& config, const net::NetOptions& net,
                      TcpOptions& options);
void hand_on(const TcpOptions& options, std::vector<std::string>& args);

}  // namespace kvrelay::worker::tcp
