// The connecting end of a connection, for every network transport (a tcp
// lane, an rdma session's control connection): resolve and connect within a
// deadline, tune the socket, run the handshake (client_auth.h: prove the
// key, check the listener's proof, start the sealed session, say hello).
// Subclasses say what happens once the listener accepted and what later
// messages mean; the deadline closes a channel that has not called
// mark_ready() in time (connect, handshake and whatever the subclass adds).
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <optional>
#include <string>

#include "instance/auth_key.h"
#include "worker/net/channel.h"
#include "worker/net/client_auth.h"

namespace kvrelay::worker::net {

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
                const AuthKey& key, Protection protection, Hello hello, ClientTarget target);

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
  // Why the connection closed, as transfers should hear it: a listener that
  // hangs up on this side's proof refused the key (it says nothing more to
  // a peer that has not proved it); the connect deadline passing while the
  // proof waits for an answer is said as that.
  std::string describe_close(const std::string& reason) const;

 private:
  void on_message(Inbound in) final;

  boost::asio::ip::tcp::resolver resolver_;
  boost::asio::steady_timer deadline_;
  ClientTarget target_;
  Protection protection_;
  ClientHandshake handshake_;
  bool accepted_ = false;
  std::atomic<bool> ready_{false};
  std::atomic<bool> timed_out_{false};  // closed by the connect deadline
};

}  // namespace kvrelay::worker::net
