#include "worker/tcp/channel.h"

#include <fmt/format.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

namespace kvrelay::worker::tcp {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {
constexpr uint64_t kReadChunk = 4u << 20;  // payload read per syscall, at most
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
  auto done = [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
    if (self->closed_) return;
    if (ec) {
      self->close(fmt::format("send failed: {}", ec.message()));
      return;
    }
    self->last_tx_ = Clock::now();
    Outgoing sent = std::move(self->outbox_.front());
    self->outbox_.pop_front();
    if (sent.written) sent.written();
    self->write_next();
  };
  if (m.buffers.empty()) {
    asio::async_write(socket_, asio::buffer(m.owned), std::move(done));
  } else {
    asio::async_write(socket_, m.buffers, std::move(done));
  }
}

void Channel::read_next() {
  if (closed_) return;
  asio::async_read(
      socket_, asio::buffer(prefix_),
      [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
        if (self->closed_) return;
        if (ec) {
          self->close(ec == asio::error::eof ? "the peer closed the connection"
                                             : fmt::format("receive failed: {}", ec.message()));
          return;
        }
        self->last_rx_ = Clock::now();
        Result<uint32_t> len = parse_length(std::span<const uint8_t, 4>(self->prefix_, 4));
        if (!len) {
          self->close(len.error().message);
          return;
        }
        self->body_.resize(*len / 8);
        asio::async_read(
            self->socket_, asio::buffer(self->body_.data(), *len),
            [self](const boost::system::error_code& ec2, size_t n) {
              if (self->closed_) return;
              if (ec2) {
                self->close(fmt::format("receive failed: {}", ec2.message()));
                return;
              }
              self->last_rx_ = Clock::now();
              Result<Inbound> in = decode_envelope(std::span<const std::byte>(
                  reinterpret_cast<const std::byte*>(self->body_.data()), n));
              if (!in) {
                self->close(in.error().message);
                return;
              }
              self->on_message(std::move(in).value());
            });
      });
}

void Channel::read_some_into(std::byte* dst, uint64_t left, bool keep, std::function<void()> then) {
  if (left == 0) {
    then();
    return;
  }
  const uint64_t chunk = std::min(left, keep ? kReadChunk : uint64_t{discard_.size()});
  socket_.async_read_some(
      asio::buffer(keep ? dst : discard_.data(), chunk),
      [self = shared_from_this(), dst, left, keep, then = std::move(then)](
          const boost::system::error_code& ec, size_t n) mutable {
        if (self->closed_) return;
        if (ec) {
          self->close(fmt::format("receive failed in a frame's payload: {}", ec.message()));
          return;
        }
        self->last_rx_ = Clock::now();
        self->read_some_into(keep ? dst + n : dst, left - n, keep, std::move(then));
      });
}

void Channel::read_payload(std::byte* dst, uint64_t bytes, std::function<void()> then) {
  read_some_into(dst, bytes, true, std::move(then));
}

void Channel::discard_payload(uint64_t bytes, std::function<void()> then) {
  if (discard_.empty()) discard_.resize(64 * 1024);
  read_some_into(nullptr, bytes, false, std::move(then));
}

void Channel::close(const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ignored;
  timer_.cancel();
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  outbox_.clear();
  on_closed(reason);
}

}  // namespace kvrelay::worker::tcp
