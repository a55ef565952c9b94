// The options that kvrelay-coordinator hands on to every worker it starts:
// the data plane's and each network transport's. Each part is declared once,
// by its owner (net/net_options.h, tcp/tcp_options.h, rdma/rdma_options.h),
// and this file runs them all, for both programs:
//
//   coordinator: declare, parse, settle against the instance, hand on;
//   worker:      declare, parse, settle against the instance it attached to.
//
// So a flag, its help, its limits and its checks exist in one place, and a
// mistake stops the coordinator with the same message a worker started by
// hand would give. A transport with flags adds one row to the table in
// transport_options.cpp. This is a library of its own (kvrelay_transport_options):
// the coordinator links it, and nothing else of the worker.
#pragma once

#include <string>
#include <vector>

#include "instance/instance_config.h"
#include "shm/result.h"
#include "worker/network_options.h"

namespace CLI {
class App;
}

namespace kvrelay::worker {

void declare_transport_options(CLI::App& app, NetworkOptions& options);
// Checks what needs the instance (its role, protocols and ports), and makes
// paths absolute.
Status settle_transport_options(const InstanceConfig& config, NetworkOptions& options);
// The worker's command-line arguments that reproduce `options`.
std::vector<std::string> hand_on_transport_options(const InstanceConfig& config,
                                                   const NetworkOptions& options);

}  // namespace kvrelay::worker
