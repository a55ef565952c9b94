// The worker's network flags (kvrelay-worker --help; the coordinator hands
// them on from its own): what the network transports and their listeners
// are built with (transport_registry.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/net/envelope.h"

namespace kvrelay::worker {

namespace rdma {
class Fabric;
}

struct NetworkOptions {
  std::string listen_address = "127.0.0.1";
  std::string auth_key_file;  // empty: no tcp
  // How sessions are protected once the key is proved (net/session_seal.h):
  // every byte authenticated, or encrypted too. Both sides must agree.
  net::Protection protection = net::Protection::kAuthenticate;
  uint32_t lanes = 2;  // parallel connections per decode rank
  // rdma, when the instance accepts it: the device of each rank
  // (--rdma-devices; empty or "auto": the first device), its port, GID
  // index and traffic class, and queue pairs per decode rank.
  std::vector<std::string> rdma_devices;
  uint32_t rdma_port = 1;
  int rdma_gid_index = 1;
  uint32_t rdma_traffic_class = 0;
  uint32_t rdma_queue_pairs = 2;
  // Tests: the fabric to use instead of opening a device.
  std::shared_ptr<rdma::Fabric> rdma_fabric;
  // Not the network's, but set with it: GPU-to-GPU copies (ipc between
  // GPUs, swap within one) run their gather kernel on at most this many SMs
  // (--copy-max-sms).
  uint32_t copy_max_sms = 16;
  // A GPU pool over tcp: each connection stages payloads through two
  // page-locked slots of this many MiB (at least a block).
  uint32_t staging_slot_mib = 8;
};

}  // namespace kvrelay::worker
