#include "worker/tcp/channel.h"

#include <fmt/format.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

namespace kvrelay::worker::tcp {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {
constexpr uint64_t kReadChunk = 4u << 20;        // payload read straight into memory per call
constexpr size_t kRxBytes = 128u << 10;          // the receive buffer
constexpr uint64_t kDirectReadBytes = 32u << 10;  // larger rests of payloads skip it
constexpr size_t kEnvelopeRead = 512;             // an envelope and its prefix, with room
}

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
  socket_.non_blocking(true, ignored);  // write_some() calls writev itself
  last_rx_ = last_tx_ = Clock::now();
  watch();
  read_next();
}

void Channel::watch() {
  timer_.expires_after(timing_.heartbeat);
  timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    if (ec || self->closed_) return;
    const auto now = Clock::now();
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - self->last_rx_);
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
    self->watch();
  });
}

void Channel::send(Outgoing message) {
  if (closed_) return;
  outbox_.push_back(std::move(message));
  if (!writing_) write_next();
}

void Channel::write_next() {
  if (closed_ || outbox_.empty()) {
    writing_ = false;
    return;
  }
  writing_ = true;
  Outgoing& m = outbox_.front();
  if (m.buffers.empty()) m.buffers.emplace_back(m.owned.data(), m.owned.size());
  iov_.clear();
  for (const asio::const_buffer& b : m.buffers)
    iov_.push_back(iovec{const_cast<void*>(b.data()), b.size()});
  iov_at_ = 0;
  write_some();
}

// Gather-writes straight from the message's buffers, up to IOV_MAX of them
// per call (asio's own gather write stops at 64), waiting for the socket when
// it is full.
void Channel::write_some() {
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
                             self->write_some();
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
  Outgoing sent = std::move(outbox_.front());
  outbox_.pop_front();
  if (sent.written) sent.written();
  write_next();
}

// Reads go into rx_ and envelopes are parsed from there. A payload takes
// what rx_ already holds of it; the rest is read straight into its
// destination when it is large, else through rx_. The socket is read with
// recv() for as long as it has data, and waited on (async_wait) only when it
// has none: a handler per read would cost more than the read.
void Channel::read_next() {
  if (in_read_next_) {  // called from on_message: the loop below continues
    read_again_ = true;
    return;
  }
  in_read_next_ = true;
  for (;;) {
    read_again_ = false;
    if (closed_) break;
    if (parse_one()) {
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
  Result<uint32_t> len = parse_length(
      std::span<const uint8_t, 4>(reinterpret_cast<const uint8_t*>(rx_.data() + rx_begin_), 4));
  if (!len) {
    close(len.error().message);
    return true;
  }
  if (buffered < 4 + size_t{*len}) return false;
  body_.resize(*len / 8);  // capnp reads aligned words
  std::memcpy(body_.data(), rx_.data() + rx_begin_ + 4, *len);
  rx_begin_ += 4 + size_t{*len};
  Result<Inbound> in = decode_envelope(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(body_.data()), *len));
  if (!in) {
    close(in.error().message);
    return true;
  }
  on_message(std::move(in).value());
  return true;
}

Channel::Received Channel::receive(std::byte* dst, size_t n, size_t* got) {
  for (;;) {
    const ssize_t r = ::recv(socket_.native_handle(), dst, n, 0);
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
  if (rx_.empty()) rx_.resize(kRxBytes);
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
  if (large_payloads_) want = std::min(want, kEnvelopeRead);
  size_t got = 0;
  const Received r = receive(rx_.data() + rx_end_, want, &got);
  rx_end_ += got;
  return r;
}

void Channel::wait_readable(std::function<void()> then) {
  socket_.async_wait(asio::ip::tcp::socket::wait_read,
                     [self = shared_from_this(), then = std::move(then)](
                         const boost::system::error_code& ec) {
                       if (self->closed_) return;
                       if (ec) return self->close(fmt::format("receive failed: {}", ec.message()));
                       then();
                     });
}

void Channel::take_payload(std::byte* dst, uint64_t left, std::function<void()> then) {
  for (;;) {
    const size_t buffered = std::min<uint64_t>(rx_end_ - rx_begin_, left);
    if (dst != nullptr && buffered > 0) std::memcpy(dst, rx_.data() + rx_begin_, buffered);
    rx_begin_ += buffered;
    left -= buffered;
    if (dst != nullptr) dst += buffered;
    if (left == 0) return then();
    Received r;
    if (dst != nullptr && left >= kDirectReadBytes) {  // large: no copy through rx_
      size_t got = 0;
      r = receive(dst, std::min(left, kReadChunk), &got);
      dst += got;
      left -= got;
    } else {
      r = receive_into_rx();
    }
    if (r == Received::kClosed) return;
    if (r == Received::kNothingYet) {
      return wait_readable(
          [self = shared_from_this(), dst, left, then = std::move(then)]() mutable {
            self->take_payload(dst, left, std::move(then));
          });
    }
  }
}

void Channel::read_payload(std::byte* dst, uint64_t bytes, std::function<void()> then) {
  large_payloads_ = bytes >= kDirectReadBytes;
  take_payload(dst, bytes, std::move(then));
}

void Channel::discard_payload(uint64_t bytes, std::function<void()> then) {
  take_payload(nullptr, bytes, std::move(then));
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

}  // namespace kvrelay::worker::tcp
