// One connection of a network transport, either end: reads envelopes (and
// payloads straight into memory), writes queued messages (gather writes:
// envelopes and payload memory, no staging copy), sends heartbeats when the
// line is quiet, and closes when the peer is silent for longer than the peer
// timeout (a partition: no reset ever comes) or the socket fails (a reset:
// noticed at once). Subclasses say what a message means.
//
// Before the session starts (start_session(), once both ends proved the
// key) nothing is sealed, the receive buffer is small, envelopes are small,
// and no heartbeat is sent: the handshake's deadline, not the silence
// watch, bounds that phase. From then on every record both ways carries its
// tag (session_seal.h), and one that fails closes the connection.
//
// A read loop yields (posts itself) after a bounded amount of work, so that
// a peer that keeps the socket full cannot hold a network thread, and the
// connection's timers still run.
//
// Lives on a strand (its socket's executor): every method runs there, except
// closed(), which any thread may read.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "worker/net/envelope.h"
#include "worker/net/session_seal.h"

namespace kvrelay::worker::net {

struct Timing {
  std::chrono::milliseconds heartbeat{100};     // send one when nothing was sent for this long
  std::chrono::milliseconds peer_timeout{800};  // close when nothing was received for this long
};

// A message to write: envelopes encoded back to back into `owned`, each
// payload sent right after the envelope that ends at owned offset `after`.
// A payload marked `continues` is one record with the next (same `after`):
// a frame of several runs gathered from several places, under one tag.
// `written` runs once the bytes are handed to the kernel; payload memory
// must stay as it is until then.
struct Outgoing {
  struct Payload {
    size_t after = 0;
    const std::byte* data = nullptr;
    uint64_t bytes = 0;
    bool continues = false;
  };
  std::vector<std::byte> owned;
  std::vector<Payload> payloads;  // in order of `after`
  std::function<void()> written;
  bool sealed = false;  // set by send(): the session had started
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
  // Messages queued and not yet written (for callers that bound their own).
  size_t queued() const { return outbox_.size(); }

  // Reads the next envelope, then calls on_message.
  void read_next();
  // Reads `bytes` of payload into `dst`, then calls `then`; counts as traffic
  // as it goes, so a long payload over a slow link is not silence. A
  // payload read in several pieces (into staging slots) is one record:
  // `first` begins it, `last` checks its tag.
  void read_payload(std::byte* dst, uint64_t bytes, std::function<void()> then, bool first = true,
                    bool last = true);
  // Reads one payload that lands in several places, in order (a frame of
  // several runs), as one record; `then` runs once all of it has landed and
  // its tag is checked.
  void read_scattered(std::span<const iovec> pieces, std::function<void()> then);
  // Reads and drops `bytes` of payload (a refused frame's), then `then`.
  void discard_payload(uint64_t bytes, std::function<void()> then);

 protected:
  // Starts the silence watch, then reads the first envelope.
  void start_channel();
  // Both ends proved the key: every record sent after this call (messages
  // send() queues from now on) and received after it is sealed.
  void start_session(const SessionKeys& keys, Protection mode, bool client);
  bool in_session() const { return send_seal_ != nullptr; }
  virtual void on_message(Inbound message) = 0;
  virtual void on_closed(const std::string& reason) = 0;

  boost::asio::ip::tcp::socket socket_;
  Timing timing_;

 private:
  void write_next();
  bool build_batch();
  void write_batch();
  void watch();
  bool parse_one();  // one envelope from rx_, or false when it is not all there yet
  enum class Received { kSome, kNothingYet, kClosed };
  Received receive(std::byte* dst, size_t n, size_t* got);
  Received receive_scattered(const iovec* pieces, size_t count, size_t* got);
  Received receive_into_rx();
  void wait_readable(std::function<void()> then);
  void start_payload(std::span<const iovec> pieces, bool first);
  void take_payload(bool last, std::function<void()> then);
  void advance_landing(uint64_t n);
  Received receive_direct(size_t* got);
  void take_tag(std::function<void()> then);

  std::string peer_name_;
  boost::asio::steady_timer timer_;
  std::atomic<bool> closed_{false};

  // Sending: the front message is written in batches (an iovec list of at
  // most IOV_MAX pieces and kBatchBytes of payload), each sealed as it is
  // built, in wire order.
  std::deque<Outgoing> outbox_;
  bool writing_ = false;
  std::unique_ptr<RecordSeal> send_seal_;
  struct Cursor {
    size_t envelope_at = 0;     // next envelope's offset in owned
    size_t payload = 0;         // next payload's index
    uint64_t payload_done = 0;  // bytes of it already in batches
    bool in_payload = false;    // the payload's record is begun
  } cursor_;
  std::vector<iovec> iov_;
  size_t iov_at_ = 0;
  std::vector<Tag> tags_;          // this batch's
  std::vector<std::byte> bounce_;  // kEncrypt: this batch's encrypted payload bytes
  bool batch_ends_message_ = false;

  // Receiving.
  std::unique_ptr<RecordSeal> receive_seal_;
  std::vector<std::byte> rx_;  // received, not yet parsed: [rx_begin_, rx_end_)
  size_t rx_begin_ = 0, rx_end_ = 0;
  bool in_read_next_ = false, read_again_ = false;
  bool large_payloads_ = false;  // the last payload was read mostly straight into memory
  size_t envelope_missing_ = 0;  // bytes of a partly received envelope still to come
  // The payload being read: what is left of its pieces (iov_base null: dropped).
  std::vector<iovec> landing_;
  size_t landing_at_ = 0;
  uint64_t landing_left_ = 0;
  std::vector<uint64_t> body_;   // 8-byte aligned envelope buffer
  std::chrono::steady_clock::time_point last_rx_;
  std::chrono::steady_clock::time_point last_tx_;
};

}  // namespace kvrelay::worker::net
