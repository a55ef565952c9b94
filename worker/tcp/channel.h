// One tcp connection of the transport, either end: reads envelopes (and
// payloads straight into memory), writes queued messages (gather writes:
// envelope headers and pool memory, no staging copy), sends heartbeats when
// the line is quiet, and closes when the peer is silent for longer than the
// peer timeout (a partition: no reset ever comes) or the socket fails (a
// reset: noticed at once). Subclasses say what a message means.
//
// Lives on the network thread: every method is called there.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/tcp/wire.h"

namespace kvrelay::worker::tcp {

struct Timing {
  std::chrono::milliseconds heartbeat{100};     // send one when nothing was sent for this long
  std::chrono::milliseconds peer_timeout{800};  // close when nothing was received for this long
};

// A message to write: `buffers` point into `owned` and, for frames, into a
// pool. `written` runs once the bytes are handed to the kernel.
struct Outgoing {
  std::vector<std::byte> owned;
  std::vector<boost::asio::const_buffer> buffers;  // empty: just `owned`
  std::function<void()> written;
};

// Sets TCP_NODELAY and TCP_USER_TIMEOUT (unacknowledged data older than the
// peer timeout resets the connection).
void tune_socket(boost::asio::ip::tcp::socket& socket, std::chrono::milliseconds user_timeout);

class Channel : public std::enable_shared_from_this<Channel> {
 public:
  Channel(boost::asio::ip::tcp::socket socket, Timing timing, std::string peer_name);
  virtual ~Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  void send(Outgoing message);
  // Closes once: cancels everything and calls on_closed(reason).
  void close(const std::string& reason);
  bool closed() const { return closed_; }
  const std::string& peer_name() const { return peer_name_; }

 protected:
  // Starts the heartbeat and silence watch, then reads the first envelope.
  void start_channel();
  // Reads the next envelope, then calls on_message.
  void read_next();
  // Reads `bytes` of payload into `dst`, then calls `then`; counts as traffic
  // as it goes, so a long payload over a slow link is not silence.
  void read_payload(std::byte* dst, uint64_t bytes, std::function<void()> then);
  // Reads and drops `bytes` of payload (a refused frame's), then `then`.
  void discard_payload(uint64_t bytes, std::function<void()> then);
  virtual void on_message(Inbound message) = 0;
  virtual void on_closed(const std::string& reason) = 0;

  boost::asio::ip::tcp::socket socket_;
  Timing timing_;

 private:
  void write_next();
  void watch();
  void read_some_into(std::byte* dst, uint64_t left, bool keep, std::function<void()> then);

  std::string peer_name_;
  boost::asio::steady_timer timer_;
  std::deque<Outgoing> outbox_;
  bool writing_ = false;
  bool closed_ = false;
  uint8_t prefix_[4] = {};
  std::vector<uint64_t> body_;  // 8-byte aligned envelope buffer
  std::vector<std::byte> discard_;
  std::chrono::steady_clock::time_point last_rx_;
  std::chrono::steady_clock::time_point last_tx_;
};

}  // namespace kvrelay::worker::tcp
