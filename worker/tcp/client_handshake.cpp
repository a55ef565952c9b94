#include "worker/tcp/client_handshake.h"

#include <fmt/format.h>

namespace kvrelay::worker::tcp {

Result<bool> ClientHandshake::on_message(const Inbound& in, std::vector<std::byte>& reply) {
  if (in.kind == schema::TcpEnvelope::HEARTBEAT) return false;  // a quiet line, nothing more
  if (!challenged_) {
    if (in.kind != schema::TcpEnvelope::CHALLENGE || in.nonce.size() != kNonceBytes)
      return make_error(Errc::kInvalidArgument,
                        "the listener is not a kvrelay tcp receiver (no challenge)");
    challenged_ = true;
    server_nonce_ = in.nonce;
    const Nonce mine = random_nonce();
    nonce_.assign(mine.begin(), mine.end());
    encode_proof(mine, key_.mac(kConnectLabel, server_nonce_, nonce_), reply);
    encode_hello(hello_, reply);
    return false;
  }
  if (in.kind != schema::TcpEnvelope::HELLO_ACK)
    return make_error(Errc::kInvalidArgument, "the receiver did not answer the hello");
  if (!in.hello_ack.accepted)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("the receiver refused the connection: {}", in.hello_ack.reason));
  if (!key_.verify(kAcceptLabel, nonce_, server_nonce_, in.hello_ack.proof))
    return make_error(Errc::kInvalidArgument,
                      "the receiver could not prove it holds the key (a different key there?)");
  ack_ = in.hello_ack;
  return true;
}

}  // namespace kvrelay::worker::tcp
