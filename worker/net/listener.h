// The accepting side of every network transport (a decode-role worker): one
// listener per port. It authenticates each connection (server_auth.h),
// starts its sealed session, checks the peer's hello against this rank's
// pool, answers with a helloAck, and from then on hands each transport
// message to the handler its transport registered (handler.h), made for the
// connection at its first message of that protocol (or at the handshake).
// It names no transport.
//
// Before a peer has proved the key it costs a few KiB and nothing else: it
// gets a challenge and nothing more, may send nothing but a proof, is cut
// off at the handshake deadline whatever it sends, and such half-open
// connections are capped, in all and per source address. Accepting never
// spins: out of descriptors, it sheds the connection it cannot serve and
// backs off.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "instance/auth_key.h"
#include "instance/head_layout.h"
#include "instance/pool_geometry.h"
#include "worker/net/channel.h"
#include "worker/net/handler.h"
#include "worker/net/net_thread.h"

namespace kvrelay::worker::net {

struct ListenerOptions {
  std::string address = "127.0.0.1";
  uint16_t port = 0;
  std::string instance;  // this instance's name (hello's expected instance)
  uint32_t rank = 0;
  PoolGeometry pool;  // this rank's pool: hellos are checked against it
  // This instance's head layout: senders of another TP size that serve the
  // same model heads are accepted (heterogeneous TP). None: the senders'
  // pools must match this one exactly.
  std::optional<HeadLayout> heads;
  Timing timing;
  Protection protection = Protection::kAuthenticate;
  std::chrono::milliseconds handshake_timeout{2000};
  // Connections that have not proved the key, at most (each costs a few
  // KiB), in all and from one address (a prefill host opens ranks x lanes
  // at once: 16 x 8).
  uint32_t max_unauthenticated = 512;
  uint32_t max_unauthenticated_per_source = 128;
  // The transports this listener serves.
  std::vector<HandlerFactory> handlers;
};

struct ListenerStats {
  std::atomic<uint64_t> accepted{0};  // proved the key and were served
  std::atomic<uint64_t> refused{0};   // failed authentication or the hello, or were shed
  // Pauses of the accept loop for want of descriptors (one per 100 ms at
  // most while they last: a loop that spun would count thousands).
  std::atomic<uint64_t> accept_backoffs{0};
};

class Listener {
 public:
  // Binds now (the error names the address and port); accepts on `net`.
  static Result<std::unique_ptr<Listener>> start(NetThread& net, const AuthKey& key,
                                                 ListenerOptions options);
  // Stops accepting, closes every connection and waits: after this no
  // handler runs.
  ~Listener();
  const ListenerStats& stats() const { return *stats_; }
  uint16_t port() const { return port_; }

  struct Shared;  // what the listener's connections share (listener.cpp)

 private:
  Listener(std::shared_ptr<Shared> shared, std::shared_ptr<ListenerStats> stats, uint16_t port);
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<ListenerStats> stats_;
  uint16_t port_;
};

}  // namespace kvrelay::worker::net
