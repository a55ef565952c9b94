// One tcp connection of the transport, either end: reads envelopes (and
// payloads straight into memory), writes queued messages (gather writes:
// envelope headers and pool memory, no staging copy), sends heartbeats when
// the line is quiet, and closes when the peer is silent for longer than the
// peer timeout (a partition: no reset ever comes) or the socket fails (a
// reset: noticed at once). Subclasses say what a message means.
//
// Lives on a strand (its socket's executor): every method runs there, except
// closed(), which any thread may read.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <sys/uio.h>

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
  // From any thread: closes on the channel's strand; `then` runs after.
  void close_soon(const std::string& reason, std::function<void()> then);
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  boost::asio::any_io_executor executor() { return socket_.get_executor(); }
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
  void write_some();
  void watch();
  bool parse_one();  // one envelope from rx_, or false when it is not all there yet
  enum class Received { kSome, kNothingYet, kClosed };
  Received receive(std::byte* dst, size_t n, size_t* got);
  Received receive_into_rx();
  void wait_readable(std::function<void()> then);
  void take_payload(std::byte* dst, uint64_t left, std::function<void()> then);

  std::string peer_name_;
  boost::asio::steady_timer timer_;
  std::deque<Outgoing> outbox_;
  bool writing_ = false;
  std::atomic<bool> closed_{false};
  std::vector<iovec> iov_;  // the message being written
  size_t iov_at_ = 0;
  std::vector<std::byte> rx_;  // received, not yet parsed: [rx_begin_, rx_end_)
  size_t rx_begin_ = 0, rx_end_ = 0;
  bool in_read_next_ = false, read_again_ = false;
  bool large_payloads_ = false;  // the last payload was read mostly straight into memory
  std::vector<uint64_t> body_;  // 8-byte aligned envelope buffer
  std::chrono::steady_clock::time_point last_rx_;
  std::chrono::steady_clock::time_point last_tx_;
};

}  // namespace kvrelay::worker::tcp
