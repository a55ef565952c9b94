// The rdma transport's half of a listener (net/listener.h): on a connection
// whose peer offers queue pairs, an rdma session (rdma_receiver.h) answers
// with its own and where the pool is, grants or refuses each transfer's
// intent, and acks each transfer once its writes have landed. Its queue
// pairs' completion events are handled on the connection's strand.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>

#include "worker/arrivals.h"
#include "worker/net/handler.h"
#include "worker/rdma/rdma_receiver.h"

namespace kvrelay::worker::rdma {

struct SessionStats {
  std::atomic<uint64_t> sessions{0};
  std::atomic<uint64_t> transfers{0};  // landed
  std::atomic<uint64_t> refused{0};    // intents refused
};

// The handler factory a listener serves rdma sessions with. `listener`
// null: every offer is refused, saying `why_not`.
// `grace`: how long a granted transfer's writes may take to land, beyond a
// second per 256 MiB (then the session ends).
net::HandlerFactory session_handler(
    std::shared_ptr<RdmaListener> listener, std::string why_not, std::shared_ptr<Arrivals> arrivals,
    uint32_t rank, std::shared_ptr<SessionStats> stats,
    std::chrono::milliseconds grace = std::chrono::milliseconds(800));

}  // namespace kvrelay::worker::rdma
