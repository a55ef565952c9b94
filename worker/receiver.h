// A listener that serves tcp frames and rdma sessions on one port, as a
// decode rank's do (Transports opens those from the registry): for the
// benchmarks and tests that need a receiving side without a whole worker.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "instance/auth_key.h"
#include "worker/arrivals.h"
#include "worker/local_pool.h"
#include "worker/net/listener.h"
#include "worker/rdma/rdma_receiver.h"
#include "worker/rdma/session_handler.h"
#include "worker/tcp/frame_receiver.h"

namespace kvrelay::worker {

struct ReceiverOptions {
  std::string address = "127.0.0.1";
  uint16_t port = 0;
  std::string instance;
  uint32_t rank = 0;
  std::optional<HeadLayout> heads;
  net::Timing timing;
  net::Protection protection = net::Protection::kAuthenticate;
  std::chrono::milliseconds handshake_timeout{2000};
  std::shared_ptr<Arrivals> arrivals;  // none: a private one
  std::shared_ptr<tcp::Stager> stager;
  bool stage_at_handshake = false;
  // rdma sessions; none: offers are refused, saying rdma is not served here.
  std::shared_ptr<rdma::RdmaListener> rdma;
  // tcp frames; false: as a decode rank without tcp in --protocol (frames
  // close the connection).
  bool frames = true;
};

class Receiver {
 public:
  static Result<std::unique_ptr<Receiver>> start(net::NetThread& net, const LocalPool& pool,
                                                 const AuthKey& key, ReceiverOptions options);
  // Closes every connection and waits; then drains the stager's copies.
  ~Receiver();
  uint16_t port() const { return listener_->port(); }
  const net::ListenerStats& connections() const { return listener_->stats(); }
  const tcp::FrameStats& frames() const { return *frames_; }
  const rdma::SessionStats& sessions() const { return *sessions_; }

 private:
  Receiver() = default;
  std::shared_ptr<tcp::FrameStats> frames_ = std::make_shared<tcp::FrameStats>();
  std::shared_ptr<rdma::SessionStats> sessions_ = std::make_shared<rdma::SessionStats>();
  std::shared_ptr<tcp::Stager> stager_;
  std::unique_ptr<net::Listener> listener_;
};

}  // namespace kvrelay::worker
