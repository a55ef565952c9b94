#include "worker/net/client_channel.h"

#include <fmt/format.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/strand.hpp>

namespace kvrelay::worker::net {

namespace asio = boost::asio;

ClientChannel::ClientChannel(asio::io_context& io, Timing timing, std::string peer_name,
                             const AuthKey& key, Protection protection, Hello hello,
                             ClientTarget target)
    : Channel(asio::ip::tcp::socket(asio::make_strand(io)), timing, std::move(peer_name)),
      resolver_(socket_.get_executor()),
      deadline_(socket_.get_executor()),
      target_(std::move(target)),
      protection_(protection),
      handshake_(key, protection, std::move(hello)) {}

void ClientChannel::connect() {
  auto self = std::static_pointer_cast<ClientChannel>(shared_from_this());
  deadline_.expires_after(target_.timeout);
  deadline_.async_wait([self](const boost::system::error_code& ec) {
    if (!ec && !self->ready()) {
      self->timed_out_ = true;
      self->close(
          fmt::format("no {} within {} ms", self->target_.steps, self->target_.timeout.count()));
    }
  });
  resolver_.async_resolve(
      target_.host, std::to_string(target_.port),
      [self](const boost::system::error_code& ec, asio::ip::tcp::resolver::results_type results) {
        if (self->closed()) return;
        if (ec)
          return self->close(
              fmt::format("cannot resolve {}: {}", self->target_.host, ec.message()));
        asio::async_connect(
            self->socket_, results,
            [self](const boost::system::error_code& ec2, const asio::ip::tcp::endpoint&) {
              if (self->closed()) return;
              if (ec2) return self->close(fmt::format("cannot connect: {}", ec2.message()));
              tune_socket(self->socket_, self->timing_.peer_timeout);
              self->start_channel();  // the listener speaks first: its challenge
            });
      });
}

void ClientChannel::on_message(Inbound in) {
  if (accepted_) return on_serving(std::move(in));
  Result<HandshakeStep> step = handshake_.on_message(in);
  if (!step) return close(step.error().message);
  if (!step->send_plain.empty()) {
    Outgoing out;
    out.owned = std::move(step->send_plain);
    send(std::move(out));
  }
  if (step->start_session) start_session(*step->start_session, protection_, /*client=*/true);
  if (!step->send_sealed.empty()) {
    Outgoing out;
    out.owned = std::move(step->send_sealed);
    send(std::move(out));
  }
  if (!step->done) return read_next();
  accepted_ = true;
  on_accepted();
}

std::string ClientChannel::describe_close(const std::string& reason) const {
  if (!handshake_.awaiting_server_proof()) return reason;
  // Our own deadline, not the listener's answer: a slow or overloaded peer
  // (or one that dropped the proof) looks like this too; say so, not "key".
  if (timed_out_)
    return fmt::format("{} (the listener had not answered this side's proof of the key)", reason);
  return fmt::format(
      "authentication failed: the listener refused this side's proof of the key "
      "(a different key there?) ({})",
      reason);
}

void ClientChannel::mark_ready() {
  ready_.store(true, std::memory_order_release);
  deadline_.cancel();
}

void ClientChannel::stop_connecting() {
  resolver_.cancel();
  deadline_.cancel();
}

}  // namespace kvrelay::worker::net
