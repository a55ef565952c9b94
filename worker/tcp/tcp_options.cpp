#include "worker/tcp/tcp_options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iterator>

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
  const bool receives = config.role != static_cast<uint32_t>(Role::kPrefill);
  const bool listens = std::any_of(std::begin(config.tcp_ports), std::end(config.tcp_ports),
                                   [](uint16_t p) { return p != 0; });
  if (receives && listens && net.auth_key_file.empty())
    return make_error(Errc::kInvalidArgument,
                      "--tcp-ports needs --auth-key-file: a listener must authenticate its peers "
                      "(docs/transports.md: Cross-host transfer)");
  return {};
}

void hand_on(const TcpOptions& o, std::vector<std::string>& args) {
  args.insert(args.end(), {"--tcp-lanes", std::to_string(o.lanes), "--tcp-staging-mib",
                           std::to_string(o.staging_slot_mib)});
}

}  // namespace kvrelay::worker::tcp
