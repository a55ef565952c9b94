// The worker's data-plane and network options (kvrelay-worker --help; the
// coordinator hands them on from its own): one part per owner, each declared
// once for both programs (transport_options.h).
#pragma once

#include <cstdint>

#include "worker/net/net_options.h"
#include "worker/rdma/rdma_options.h"
#include "worker/tcp/tcp_options.h"

namespace kvrelay::worker {

struct NetworkOptions {
  net::NetOptions net;  // what every network transport shares: address, key, protection
  tcp::TcpOptions tcp;
  rdma::RdmaOptions rdma;
  // Not the network's, but handed on with it: GPU-to-GPU copies (ipc
  // between GPUs, swap within one, tcp staging) run their gather kernel on
  // at most this many SMs (--copy-max-sms).
  uint32_t copy_max_sms = 16;
};

}  // namespace kvrelay::worker
