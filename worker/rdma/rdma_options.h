// The rdma transport's flags, declared here once for both programs
// (transport_options.h): kvrelay-coordinator checks them and hands them on,
// kvrelay-worker reads them; each rank takes its own device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "instance/instance_config.h"
#include "shm/result.h"
#include "worker/net/net_options.h"

namespace CLI {
class App;
}

namespace kvrelay::worker::rdma {

class Fabric;

struct RdmaOptions {
  // The device of each rank: one for all, or one per rank; empty or "auto":
  // the first device.
  std::vector<std::string> devices;
  uint32_t port = 1;
  uint32_t gid_index = 1;      // RoCE
  uint32_t traffic_class = 0;  // RoCE: DSCP << 2
  uint32_t queue_pairs = 2;    // RC queue pairs per decode rank
  // Tests: the fabric to use instead of opening a device (not a flag).
  std::shared_ptr<Fabric> fabric;

  // The device rank `rank` opens ("" for the first).
  std::string device_of(uint32_t rank) const;
};

void declare_options(CLI::App& app, RdmaOptions& options);
// Refuses device flags on an instance without rdma in --protocol, a device
// list of the wrong length, and a listener (--rdma-ports) without the key.
Status settle_options(const InstanceConfig& config, const net::NetOptions& net,
                      RdmaOptions& options);
// Nothing when the instance does not accept rdma.
void hand_on(const InstanceConfig& config, const RdmaOptions& options,
             std::vector<std::string>& args);

}  // namespace kvrelay::worker::rdma
