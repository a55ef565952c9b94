// The accepting side of the tcp transport (a decode-role worker): listens on
// its rank's port, authenticates each connection (auth_key.h), checks the
// peer's hello against this rank's pool, then reads each frame's payload
// straight into the pool and acks a transfer once its last payload is there.
// A pool in GPU memory is written through staging slots instead (staging.h):
// a payload is read into a slot, copied host->device, and counts (arrivals,
// the transfer's ack) once the copy has ended.
//
// A frame that fails its checks (wire.h, check_frame) is not written: its
// payload is read and dropped, its transfer is refused with the reason (the
// sender fails that request only), and the rest of the transfer is dropped
// too. A stream that loses its framing (a bad length or envelope) is closed.
// A connection that does not authenticate within the handshake timeout, or
// fails to, is closed and logged, and has touched no pool byte.
//
// After the handshake a connection may also carry an rdma session
// (rdma_receiver.h): then it is the rdma transport's control connection.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <optional>
#include <string>

#include "instance/auth_key.h"
#include "worker/arrivals.h"
#include "worker/local_pool.h"
#include "worker/rdma/rdma_receiver.h"
#include "worker/tcp/channel.h"
#include "worker/tcp/net_thread.h"
#include "worker/tcp/staging.h"

namespace kvrelay::worker::tcp {

struct ReceiverOptions {
  std::string address = "127.0.0.1";
  uint16_t port = 0;
  std::string instance;  // this instance's name (hello's expected instance)
  uint32_t rank = 0;
  // This instance's head layout: senders of another TP size that serve the
  // same model heads are accepted (heterogeneous TP). None: the senders'
  // pools must match this one exactly.
  std::optional<HeadLayout> heads;
  Timing timing;
  std::chrono::milliseconds handshake_timeout{2000};
  // The rank's expected requests, which the ipc intake feeds too (none: a
  // private one, for tests and benchmarks).
  std::shared_ptr<Arrivals> arrivals;
  // Sessions of the rdma transport on this listener's connections
  // (rdma_receiver.h); none: rdma offers are refused, saying so.
  std::shared_ptr<rdma::RdmaListener> rdma;
  // A pool in GPU memory: payloads land in staging slots and are copied
  // host->device before they count (staging.h). None: its frames are refused.
  std::shared_ptr<Stager> stager;
  // Each connection's slots are made once its handshake is done (a tcp
  // listener, whose connections all carry frames), not with its first frame
  // (an rdma listener's carry none).
  bool stage_at_handshake = false;
};

struct ReceiverStats {
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> refused{0};  // failed authentication or hello
  std::atomic<uint64_t> frames{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> refused_frames{0};
  std::atomic<uint64_t> rdma_sessions{0};
  std::atomic<uint64_t> rdma_transfers{0};  // landed
  std::atomic<uint64_t> rdma_refused{0};    // intents refused
};

class TcpReceiver {
 public:
  // Binds now (the error names the address and port); accepts on `net`.
  static Result<std::unique_ptr<TcpReceiver>> start(NetThread& net, const LocalPool& pool,
                                                    const AuthKey& key, ReceiverOptions options);
  ~TcpReceiver();
  const ReceiverStats& stats() const { return *stats_; }
  uint16_t port() const { return port_; }

  struct Shared;  // what the listener's connections share (tcp_receiver.cpp)

 private:
  TcpReceiver(std::shared_ptr<Shared> shared, uint16_t port);
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<ReceiverStats> stats_;
  uint16_t port_;
};

}  // namespace kvrelay::worker::tcp
