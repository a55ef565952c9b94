#include "worker/tcp/tcp_options.h"

#include <CLI/CLI.hpp>

namespace kvrelay::worker::tcp {

void declare_options(CLI::App& app, TcpOptions& o) {
  app.add_option("--tcp-lanes", o.lanes, "parallel tcp connections per decode rank, 1-8")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  app.add_option("--tcp-staging-mib", o.staging_slot_mib,
                 "GPU pools over tcp: each connection stages payloads through two page-locked "
                 "slots of this many MiB")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
}

Status settle_options(const InstanceConfig& config, const net::NetOptions& net, TcpOptions&) {
  return net::require_key_to_listen(config, net, config.tcp_ports, "--tcp-ports");
}

void hand_on(const TcpOptions& o, std::vector<std::string>& args) {
  args.insert(args.end(), {"--tcp-lanes", std::to_string(o.lanes), "--tcp-staging-mib",
                           std::to_string(o.staging_slot_mib)});
}

}  // namespace kvrelay::worker::tcp
