#include "worker/rdma/rdma_options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>

namespace kvrelay::worker::rdma {

namespace {

bool wanted(const InstanceConfig& config) {
  return (config.protocols & kProtocolRdma) != 0;
}

bool defaults(const RdmaOptions& o) {
  const RdmaOptions d;
  return o.devices.empty() && o.port == d.port && o.gid_index == d.gid_index &&
         o.traffic_class == d.traffic_class && o.queue_pairs == d.queue_pairs;
}

}  // namespace

std::string RdmaOptions::device_of(uint32_t rank) const {
  if (devices.empty()) return "";
  const std::string& d = devices.size() == 1 ? devices[0] : devices.at(rank);
  return d == "auto" ? "" : d;
}

void declare_options(CLI::App& app, RdmaOptions& o) {
  app.add_option_function<std::string>(
      "--rdma-devices",
      [&o](const std::string& list) {
        o.devices.clear();
        for (size_t at = 0; at != std::string::npos;) {
          const size_t comma = list.find(',', at);
          o.devices.push_back(list.substr(at, comma - at));
          at = comma == std::string::npos ? comma : comma + 1;
        }
      },
      "rdma: the RDMA device of each rank, comma-separated (one for all ranks, or one per rank; "
      "'auto' or unset: the first device ibv_devices lists)");
  app.add_option("--rdma-ib-port", o.port, "rdma: the device port to use")
      ->check(CLI::Range(1, 255))
      ->capture_default_str();
  app.add_option("--rdma-gid-index", o.gid_index,
                 "rdma over RoCE: the GID index (show_gids lists them; RoCE v2 over IPv4 is "
                 "usually 1 or 3)")
      ->check(CLI::Range(0, 255))
      ->capture_default_str();
  app.add_option("--rdma-traffic-class", o.traffic_class,
                 "rdma over RoCE: the traffic class (DSCP << 2) of its packets, for lossless "
                 "queues")
      ->check(CLI::Range(0, 255))
      ->capture_default_str();
  app.add_option("--rdma-queue-pairs", o.queue_pairs,
                 "rdma: RC queue pairs per decode rank, used round robin, 1-16")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
}

Status settle_options(const InstanceConfig& config, const net::NetOptions& net, RdmaOptions& o) {
  if (!wanted(config)) {
    if (!defaults(o))
      return make_error(Errc::kInvalidArgument, "--rdma-* device options need rdma in --protocol");
    return {};
  }
  for (const std::string& d : o.devices)
    if (d.empty())
      return make_error(Errc::kInvalidArgument,
                        fmt::format("--rdma-devices '{}' has an empty name",
                                    fmt::join(o.devices, ",")));
  if (o.devices.size() > 1 && o.devices.size() != config.tp_size)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("--rdma-devices names {} devices for {} ranks (one for all, or "
                                  "one per rank)",
                                  o.devices.size(), config.tp_size));
  return net::require_key_to_listen(config, net, config.rdma_ports, "--rdma-ports");
}

void hand_on(const InstanceConfig& config, const RdmaOptions& o, std::vector<std::string>& args) {
  if (!wanted(config)) return;
  if (!o.devices.empty())
    args.insert(args.end(), {"--rdma-devices", fmt::format("{}", fmt::join(o.devices, ","))});
  args.insert(args.end(),
              {"--rdma-ib-port", std::to_string(o.port), "--rdma-gid-index",
               std::to_string(o.gid_index), "--rdma-traffic-class", std::to_string(o.traffic_class),
               "--rdma-queue-pairs", std::to_string(o.queue_pairs)});
}

}  // namespace kvrelay::worker::rdma
