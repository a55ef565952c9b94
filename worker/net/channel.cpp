#include "worker/net/channel.h"

#include <fmt/format.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <climits>
#include <cstring>

namespace kvrelay::worker::net {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {
constexpr uint64_t kReadChunk =
    512u << 10;  // payload read straight into memory per call (its tag pass finds it in cache)
constexpr size_t kRxBytes = 128u << 10;         // the receive buffer, in a session
constexpr size_t kHandshakeRxBytes = 4u << 10;  // before: a challenge or a proof fits
constexpr uint32_t kHandshakeEnvelopeBytes = 1024;
constexpr uint64_t kDirectReadBytes = 32u << 10;  // larger rests of payloads skip rx_
constexpr size_t kEnvelopeRead = 512;             // an envelope and its prefix, with room
constexpr size_t kDirectPieces = 64;              // pieces of a payload one direct read fills
// A write batch: at most this much payload (in kEncrypt, the bounce buffer).
constexpr uint64_t kBatchBytes = 512u << 10;
constexpr uint64_t kEncryptBatchBytes = 1u << 20;
constexpr size_t kBatchPieces = IOV_MAX - 4;  // a piece and its tag always fit
// A read loop yields after this much work, so that its strand's timers run.
constexpr int kMessagesPerTurn = 64;
constexpr uint64_t kPayloadBytesPerTurn = 16u << 20;

uint32_t length_prefix(const std::byte* p) {
  const auto* b = reinterpret_cast<const uint8_t*>(p);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}
}  // namespace

void tune_socket(asio::ip::tcp::socket& socket, std::chrono::milliseconds user_timeout) {
  boost::system::error_code ignored;
  socket.set_option(asio::ip::tcp::no_delay(true), ignored);
  const unsigned int ms = static_cast<unsigned int>(user_timeout.count());
  ::setsockopt(socket.native_handle(), IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
}

Channel::Channel(asio::ip::tcp::socket socket, Timing timing, std::string peer_name)
    : socket_(std::move(socket)),
      timing_(timing),
      peer_name_(std::move(peer_name)),
      timer_(socket_.get_executor()) {}

void Channel::start_channel() {
  boost::system::error_code ignored;
  socket_.non_blocking(true, ignored);  // write_batch() calls sendmsg itself
  last_rx_ = last_tx_ = Clock::now();
  watch();
  read_next();
}

void Channel::start_session(const SessionKeys& keys, Protection mode, bool client) {
  send_seal_ = std::make_unique<RecordSeal>(client ? keys.client_to_server : keys.server_to_client,
                                            mode, RecordSeal::Side::kSend);
  receive_seal_ = std::make_unique<RecordSeal>(
      client ? keys.server_to_client : keys.client_to_server, mode, RecordSeal::Side::kReceive);
  if (rx_.size() < kRxBytes) rx_.resize(kRxBytes);
  tags_.reserve(kBatchPieces);
  last_rx_ = last_tx_ = Clock::now();
}

void Channel::watch() {
  timer_.expires_after(timing_.heartbeat);
  timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    if (ec || self->closed_) return;
    // Before the session, the handshake's deadline is the only limit, and
    // nothing is sent that the peer has not asked for.
    if (self->in_session()) {
      const auto now = Clock::now();
      auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - self->last_rx_);
      // Bytes waiting in the socket mean this thread was busy (an rdma post
      // under soft-RoCE copies inline), not that the peer fell silent.
      boost::system::error_code available_ec;
      if (silent > self->timing_.peer_timeout && self->socket_.available(available_ec) > 0) {
        self->last_rx_ = now;
        silent = std::chrono::milliseconds(0);
      }
      if (silent > self->timing_.peer_timeout) {
        self->close(fmt::format("nothing received for {} ms (peer hung or network partitioned)",
                                silent.count()));
        return;
      }
      if (!self->writing_ && now - self->last_tx_ >= self->timing_.heartbeat) {
        Outgoing beat;
        encode_heartbeat(beat.owned);
        self->send(std::move(beat));
      }
    }
    self->watch();
  });
}

void Channel::send(Outgoing message) {
  if (closed_) return;
  message.sealed = in_session();
  outbox_.push_back(std::move(message));
  if (!writing_) write_next();
}

void Channel::write_next() {
  if (closed_ || outbox_.empty()) {
    writing_ = false;
    return;
  }
  writing_ = true;
  cursor_ = Cursor{};
  if (build_batch()) write_batch();
}

// The next batch of the front message, sealed in wire order: envelopes whole,
// payloads in pieces (a record's tag follows its last piece). Returns false
// when the connection closed.
bool Channel::build_batch() {
  Outgoing& m = outbox_.front();
  RecordSeal* seal = m.sealed ? send_seal_.get() : nullptr;
  const bool encrypting = seal != nullptr && seal->mode() == Protection::kEncrypt;
  const uint64_t budget = encrypting ? kEncryptBatchBytes : kBatchBytes;
  if (encrypting && bounce_.size() < budget) bounce_.resize(budget);
  iov_.clear();
  iov_at_ = 0;
  tags_.clear();
  uint64_t used = 0;
  auto add = [&](const void* p, size_t n) { iov_.push_back(iovec{const_cast<void*>(p), n}); };
  for (;;) {
    if (iov_.size() >= kBatchPieces) break;
    const bool payload_next = cursor_.payload < m.payloads.size() &&
                              m.payloads[cursor_.payload].after == cursor_.envelope_at;
    if (payload_next) {
      const Outgoing::Payload& p = m.payloads[cursor_.payload];
      const uint64_t left = p.bytes - cursor_.payload_done;
      const uint64_t n = std::min(left, budget - used);
      if (n == 0 && left != 0) break;  // the batch is full
      const std::byte* src = p.data + cursor_.payload_done;
      if (seal != nullptr && !cursor_.in_payload) {
        seal->begin();
        cursor_.in_payload = true;
      }
      if (n > 0) {
        if (encrypting) {
          seal->add(std::span<const std::byte>(src, n), bounce_.data() + used);
          add(bounce_.data() + used, n);
        } else {
          if (seal != nullptr) seal->add(std::span<const std::byte>(src, n), nullptr);
          add(src, n);
        }
        used += n;
        cursor_.payload_done += n;
      }
      if (cursor_.payload_done == p.bytes) {
        const bool record_goes_on = p.continues && cursor_.payload + 1 < m.payloads.size() &&
                                    m.payloads[cursor_.payload + 1].after == p.after;
        if (seal != nullptr && !record_goes_on) {
          tags_.push_back(seal->finish_send());
          add(tags_.back().data(), kTagBytes);
        }
        cursor_ = Cursor{cursor_.envelope_at, cursor_.payload + 1, 0, record_goes_on};
      }
      continue;
    }
    if (cursor_.envelope_at >= m.owned.size()) {
      batch_ends_message_ = true;
      return true;
    }
    std::byte* env = m.owned.data() + cursor_.envelope_at;
    const size_t size = 4 + size_t{length_prefix(env)};
    if (seal != nullptr) {
      seal->begin();
      seal->add_plain(std::span<const std::byte>(env, 4));
      seal->add(std::span<const std::byte>(env + 4, size - 4), env + 4);  // ours: sealed in place
      tags_.push_back(seal->finish_send());
    }
    add(env, size);
    if (seal != nullptr) add(tags_.back().data(), kTagBytes);
    cursor_.envelope_at += size;
  }
  batch_ends_message_ = false;
  return true;
}

// Gather-writes the batch straight from its pieces, up to IOV_MAX of them
// per call (asio's own gather write stops at 64), waiting for the socket when
// it is full.
void Channel::write_batch() {
  for (;;) {
    while (iov_at_ < iov_.size()) {
      msghdr msg{};
      msg.msg_iov = iov_.data() + iov_at_;
      msg.msg_iovlen = std::min<size_t>(iov_.size() - iov_at_, IOV_MAX);
      // MSG_NOSIGNAL: a peer that has gone is an error here, not a SIGPIPE
      // that kills the process.
      const ssize_t put = ::sendmsg(socket_.native_handle(), &msg, MSG_NOSIGNAL);
      if (put < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          socket_.async_wait(asio::ip::tcp::socket::wait_write,
                             [self = shared_from_this()](const boost::system::error_code& ec) {
                               if (self->closed_) return;
                               if (ec)
                                 return self->close(fmt::format("send failed: {}", ec.message()));
                               self->write_batch();
                             });
          return;
        }
        return close(fmt::format("send failed: {}", std::strerror(errno)));
      }
      last_tx_ = Clock::now();
      size_t left = static_cast<size_t>(put);
      while (left > 0 && iov_at_ < iov_.size()) {
        iovec& v = iov_[iov_at_];
        if (left >= v.iov_len) {
          left -= v.iov_len;
          ++iov_at_;
        } else {
          v.iov_base = static_cast<char*>(v.iov_base) + left;
          v.iov_len -= left;
          left = 0;
        }
      }
    }
    if (batch_ends_message_) break;
    if (!build_batch()) return;
  }
  Outgoing sent = std::move(outbox_.front());
  outbox_.pop_front();
  if (sent.written) sent.written();
  write_next();
}

// Reads go into rx_ and envelopes are parsed from there. A payload takes
// what rx_ already holds of it; the rest is read straight into its
// destination when it is large, else through rx_. The socket is read with
// recv() for as long as it has data (up to a turn's budget), and waited on
// (async_wait) only when it has none: a handler per read would cost more
// than the read.
void Channel::read_next() {
  if (in_read_next_) {  // called from on_message: the loop below continues
    read_again_ = true;
    return;
  }
  in_read_next_ = true;
  int messages = 0;
  for (;;) {
    read_again_ = false;
    if (closed_) break;
    if (messages == kMessagesPerTurn) {
      // Yield: the connection's timers (the handshake's deadline) and its
      // neighbours on this thread run before the next message.
      asio::post(executor(), [self = shared_from_this()] { self->read_next(); });
      break;
    }
    if (parse_one()) {
      ++messages;
      if (read_again_) continue;
      break;  // the message's handler goes on later (a payload being awaited)
    }
    const Received r = receive_into_rx();
    if (r == Received::kSome) continue;
    if (r == Received::kNothingYet)
      wait_readable([self = shared_from_this()] { self->read_next(); });
    break;
  }
  in_read_next_ = false;
}

bool Channel::parse_one() {
  const size_t buffered = rx_end_ - rx_begin_;
  if (buffered < 4) return false;
  const std::byte* at = rx_.data() + rx_begin_;
  Result<uint32_t> len =
      parse_length(std::span<const uint8_t, 4>(reinterpret_cast<const uint8_t*>(at), 4));
  if (len && !in_session() && *len > kHandshakeEnvelopeBytes)
    len = make_error(Errc::kCorrupt, fmt::format("an envelope of {} bytes before the session "
                                                 "began (a handshake message is at most {})",
                                                 *len, kHandshakeEnvelopeBytes));
  if (!len) {
    close(len.error().message);
    return true;
  }
  const size_t tag = receive_seal_ ? kTagBytes : 0;
  if (buffered < 4 + size_t{*len} + tag) {
    envelope_missing_ = 4 + size_t{*len} + tag - buffered;
    return false;
  }
  envelope_missing_ = 0;
  body_.resize(*len / 8);  // capnp reads aligned words
  auto* body = reinterpret_cast<std::byte*>(body_.data());
  if (receive_seal_) {
    receive_seal_->begin();
    receive_seal_->add_plain(std::span<const std::byte>(at, 4));
    receive_seal_->add(std::span<const std::byte>(at + 4, *len), body);
    if (receive_seal_->mode() == Protection::kAuthenticate) std::memcpy(body, at + 4, *len);
    if (!receive_seal_->finish_receive(std::span<const uint8_t, kTagBytes>(
            reinterpret_cast<const uint8_t*>(at + 4 + *len), kTagBytes))) {
      close(
          "a message failed its authentication tag: the stream was altered or injected into "
          "(or the peer does not hold this session's keys)");
      return true;
    }
  } else {
    std::memcpy(body, at + 4, *len);
  }
  rx_begin_ += 4 + size_t{*len} + tag;
  Result<Inbound> in = decode_envelope(std::span<const std::byte>(body, *len));
  if (!in) {
    close(in.error().message);
    return true;
  }
  on_message(std::move(in).value());
  return true;
}

Channel::Received Channel::receive(std::byte* dst, size_t n, size_t* got) {
  const iovec one{dst, n};
  return receive_scattered(&one, 1, got);
}

// One recvmsg into `count` pieces: kSome (`got` bytes), kNothingYet, or
// kClosed (closed, saying why).
Channel::Received Channel::receive_scattered(const iovec* pieces, size_t count, size_t* got) {
  *got = 0;
  for (;;) {
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(pieces);
    msg.msg_iovlen = count;
    const ssize_t r = ::recvmsg(socket_.native_handle(), &msg, 0);
    if (r > 0) {
      last_rx_ = Clock::now();
      *got = static_cast<size_t>(r);
      return Received::kSome;
    }
    if (r == 0) {
      close("the peer closed the connection");
      return Received::kClosed;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Received::kNothingYet;
    close(fmt::format("receive failed: {}", std::strerror(errno)));
    return Received::kClosed;
  }
}

Channel::Received Channel::receive_into_rx() {
  // Small until the session begins: a connection that never authenticates
  // costs a few KiB.
  if (rx_.empty()) rx_.resize(in_session() ? kRxBytes : kHandshakeRxBytes);
  if (rx_begin_ == rx_end_) {
    rx_begin_ = rx_end_ = 0;
  } else if (rx_begin_ > 0) {  // keep the partial message at the front
    std::memmove(rx_.data(), rx_.data() + rx_begin_, rx_end_ - rx_begin_);
    rx_end_ -= rx_begin_;
    rx_begin_ = 0;
  }
  // After a large payload the next is likely large too: read little more
  // than its envelope, so that the payload goes straight to its destination
  // instead of through rx_ (a copy).
  size_t want = rx_.size() - rx_end_;
  if (large_payloads_) want = std::min(want, std::max(kEnvelopeRead, envelope_missing_));
  if (want == 0) {  // cannot be: every envelope fits rx_
    close("a message larger than the receive buffer");
    return Received::kClosed;
  }
  size_t got = 0;
  const Received r = receive(rx_.data() + rx_end_, want, &got);
  rx_end_ += got;
  return r;
}

void Channel::wait_readable(std::function<void()> then) {
  socket_.async_wait(
      asio::ip::tcp::socket::wait_read,
      [self = shared_from_this(), then = std::move(then)](const boost::system::error_code& ec) {
        if (self->closed_) return;
        if (ec) return self->close(fmt::format("receive failed: {}", ec.message()));
        then();
      });
}

// Lands the rest of the current payload (landing_: its pieces, in wire
// order; a piece with no destination is dropped), each piece through the
// receive seal as it lands, then its tag when `last` ends the record.
void Channel::take_payload(bool last, std::function<void()> then) {
  uint64_t this_turn = 0;
  for (;;) {
    while (landing_left_ > 0 && rx_end_ > rx_begin_) {  // what rx_ holds of it
      iovec& piece = landing_[landing_at_];
      const size_t n = std::min<uint64_t>(rx_end_ - rx_begin_, piece.iov_len);
      std::byte* from = rx_.data() + rx_begin_;
      auto* dst = static_cast<std::byte*>(piece.iov_base);
      std::byte* to = dst != nullptr ? dst : from;  // a dropped payload is opened in place
      if (receive_seal_) receive_seal_->add(std::span<const std::byte>(from, n), to);
      if (dst != nullptr && (!receive_seal_ || receive_seal_->mode() == Protection::kAuthenticate))
        std::memcpy(dst, from, n);
      rx_begin_ += n;
      this_turn += n;
      advance_landing(n);
    }
    if (landing_left_ == 0) {
      if (!receive_seal_ || !last) return then();
      return take_tag(std::move(then));
    }
    if (this_turn >= kPayloadBytesPerTurn) {  // yield, as read_next does
      return asio::post(executor(),
                        [self = shared_from_this(), last, then = std::move(then)]() mutable {
                          if (!self->closed_) self->take_payload(last, std::move(then));
                        });
    }
    Received r;
    if (landing_[landing_at_].iov_base != nullptr && landing_left_ >= kDirectReadBytes) {
      size_t got = 0;  // large: straight into the pieces, no copy through rx_
      r = receive_direct(&got);
      this_turn += got;
    } else {
      r = receive_into_rx();
    }
    if (r == Received::kClosed) return;
    if (r == Received::kNothingYet) {
      return wait_readable([self = shared_from_this(), last, then = std::move(then)]() mutable {
        self->take_payload(last, std::move(then));
      });
    }
  }
}

// `n` bytes of the payload have landed, from the current piece on.
void Channel::advance_landing(uint64_t n) {
  landing_left_ -= n;
  while (n > 0) {
    iovec& piece = landing_[landing_at_];
    const size_t k = std::min<uint64_t>(n, piece.iov_len);
    if (piece.iov_base != nullptr) piece.iov_base = static_cast<std::byte*>(piece.iov_base) + k;
    piece.iov_len -= k;
    n -= k;
    if (piece.iov_len == 0) ++landing_at_;
  }
}

// One read straight into the payload's next pieces (at most kReadChunk
// bytes over kDirectPieces of them), each sealed in place as it landed.
Channel::Received Channel::receive_direct(size_t* got) {
  std::array<iovec, kDirectPieces> iov;
  size_t count = 0;
  uint64_t room = 0;
  for (size_t i = landing_at_; i < landing_.size() && count < iov.size() && room < kReadChunk;
       ++i) {
    iov[count] = landing_[i];
    iov[count].iov_len = std::min<uint64_t>(iov[count].iov_len, kReadChunk - room);
    room += iov[count].iov_len;
    ++count;
  }
  const Received r = receive_scattered(iov.data(), count, got);
  if (r != Received::kSome) return r;
  for (size_t i = 0, left = *got; left > 0; ++i) {
    const size_t n = std::min(left, iov[i].iov_len);
    auto* at = static_cast<std::byte*>(iov[i].iov_base);
    if (receive_seal_) receive_seal_->add(std::span<const std::byte>(at, n), at);
    left -= n;
  }
  advance_landing(*got);
  return Received::kSome;
}

// The payload's tag: it decides whether what landed is the peer's.
void Channel::take_tag(std::function<void()> then) {
  for (;;) {
    if (rx_end_ - rx_begin_ >= kTagBytes) {
      const bool ok = receive_seal_->finish_receive(std::span<const uint8_t, kTagBytes>(
          reinterpret_cast<const uint8_t*>(rx_.data() + rx_begin_), kTagBytes));
      rx_begin_ += kTagBytes;
      if (!ok)
        return close(
            "a payload failed its authentication tag: the stream was altered or "
            "injected into");
      return then();
    }
    const Received r = receive_into_rx();
    if (r == Received::kClosed) return;
    if (r == Received::kNothingYet)
      return wait_readable([self = shared_from_this(), then = std::move(then)]() mutable {
        self->take_tag(std::move(then));
      });
  }
}

void Channel::read_payload(std::byte* dst, uint64_t bytes, std::function<void()> then, bool first,
                           bool last) {
  const iovec piece{dst, bytes};
  start_payload(std::span<const iovec>(&piece, 1), first);
  take_payload(last, std::move(then));
}

void Channel::read_scattered(std::span<const iovec> pieces, std::function<void()> then) {
  start_payload(pieces, /*first=*/true);
  take_payload(/*last=*/true, std::move(then));
}

void Channel::discard_payload(uint64_t bytes, std::function<void()> then) {
  const iovec piece{nullptr, bytes};
  start_payload(std::span<const iovec>(&piece, 1), /*first=*/true);
  take_payload(/*last=*/true, std::move(then));
}

void Channel::start_payload(std::span<const iovec> pieces, bool first) {
  landing_.clear();
  landing_at_ = 0;
  landing_left_ = 0;
  for (const iovec& p : pieces) {
    if (p.iov_len == 0) continue;
    landing_.push_back(p);
    landing_left_ += p.iov_len;
  }
  large_payloads_ = landing_left_ >= kDirectReadBytes;
  if (receive_seal_ && first) receive_seal_->begin();
}

void Channel::close_soon(const std::string& reason, std::function<void()> then) {
  asio::dispatch(socket_.get_executor(),
                 [self = shared_from_this(), reason, then = std::move(then)] {
                   self->close(reason);
                   if (then) then();
                 });
}

void Channel::close(const std::string& reason) {
  if (closed_.exchange(true, std::memory_order_acq_rel)) return;
  boost::system::error_code ignored;
  timer_.cancel();
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  outbox_.clear();
  on_closed(reason);
}

}  // namespace kvrelay::worker::net
