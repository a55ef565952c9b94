#include "worker/transport_options.h"

#include <CLI/CLI.hpp>
#include <iterator>

namespace kvrelay::worker {

namespace {

using Args = std::vector<std::string>;

// One row per owner of flags, in --help order.
struct OptionsRow {
  void (*declare)(CLI::App&, NetworkOptions&);
  Status (*settle)(const InstanceConfig&, NetworkOptions&);
  void (*hand_on)(const InstanceConfig&, const NetworkOptions&, Args&);
};

// The data plane's own: GPU-to-GPU copies.
void declare_copy_options(CLI::App& app, NetworkOptions& o) {
  app.add_option("--copy-max-sms", o.copy_max_sms,
                 "GPU pools: the most SMs the gather kernel of a GPU-to-GPU copy or a swap takes "
                 "from the model")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
}

constexpr OptionsRow kRows[] = {
    {&declare_copy_options, [](const InstanceConfig&, NetworkOptions&) { return Status{}; },
     [](const InstanceConfig&, const NetworkOptions& o, Args& a) {
       a.insert(a.end(), {"--copy-max-sms", std::to_string(o.copy_max_sms)});
     }},
    {[](CLI::App& app, NetworkOptions& o) { net::declare_options(app, o.net); },
     [](const InstanceConfig& c, NetworkOptions& o) { return net::settle_options(c, o.net); },
     [](const InstanceConfig&, const NetworkOptions& o, Args& a) { net::hand_on(o.net, a); }},
    {[](CLI::App& app, NetworkOptions& o) { tcp::declare_options(app, o.tcp); },
     [](const InstanceConfig& c, NetworkOptions& o) {
       return tcp::settle_options(c, o.net, o.tcp);
     },
     [](const InstanceConfig&, const NetworkOptions& o, Args& a) { tcp::hand_on(o.tcp, a); }},
    {[](CLI::App& app, NetworkOptions& o) { rdma::declare_options(app, o.rdma); },
     [](const InstanceConfig& c, NetworkOptions& o) {
       return rdma::settle_options(c, o.net, o.rdma);
     },
     [](const InstanceConfig& c, const NetworkOptions& o, Args& a) {
       rdma::hand_on(c, o.rdma, a);
     }},
};

}  // namespace

void declare_transport_options(CLI::App& app, NetworkOptions& options) {
  for (const OptionsRow& row : kRows)
    row.declare(app, options);
}

Status settle_transport_options(const InstanceConfig& config, NetworkOptions& options) {
  for (const OptionsRow& row : kRows)
    if (Status s = row.settle(config, options); !s) return s;
  return {};
}

std::vector<std::string> hand_on_transport_options(const InstanceConfig& config,
                                                   const NetworkOptions& options) {
  Args args;
  for (const OptionsRow& row : kRows)
    row.hand_on(config, options, args);
  return args;
}

}  // namespace kvrelay::worker
