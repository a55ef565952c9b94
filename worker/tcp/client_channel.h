// The connecting end of a control connection, for both network transports
// (a tcp lane, an rdma session): resolve and connect within a deadline, tune
// the socket, answer the listener's challenge and check its helloAck
// (ClientHandshake). Subclasses say what happens once it is accepted and what
// later messages mean; the deadline closes a channel that has not called
// mark_ready() in time (connect, handshake and whatever the subclass adds).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>

#include "instance/auth_key.h"
#include "worker/tcp/channel.h"
#include "worker/tcp/client_handshake.h"

namespace kvrelay::worker::tcp {

struct ClientTarget {
  std::string host;
  uint16_t port = 0;
  std::chrono::milliseconds timeout{2000};
  std::string steps = "connection and handshake";  // for the deadline's message
};

class ClientChannel : public Channel {
 public:
  // On a strand of its own (connections move bytes in parallel).
  ClientChannel(boost::asio::io_context& io, Timing timing, std::string peer_name,
                const AuthKey& key, Hello hello, ClientTarget target);

  // On the channel's strand: starts connecting.
  void connect();
  bool ready() const { return ready_.load(std::memory_order_acquire); }

 protected:
  // The listener accepted the handshake (ack() holds its answer).
  virtual void on_accepted() = 0;
  // Every message after that.
  virtual void on_serving(Inbound in) = 0;
  // Ready to carry transfers: the deadline no longer applies.
  void mark_ready();
  // For on_closed(): stop resolving and the deadline.
  void stop_connecting();
  const HelloAck& ack() const { return handshake_.ack(); }

 private:
  void on_message(Inbound in) final;

  boost::asio::ip::tcp::resolver resolver_;
  boost::asio::steady_timer deadline_;
  ClientTarget target_;
  ClientHandshake handshake_;
  bool accepted_ = false;
  std::atomic<bool> ready_{false};
};

}  // namespace kvrelay::worker::tcp
