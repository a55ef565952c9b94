#include "worker/net/client_auth.h"

#include <fmt/format.h>

namespace kvrelay::worker::net {

Result<HandshakeStep> ClientHandshake::on_message(const Inbound& in) {
  HandshakeStep step;
  const uint8_t modes[1] = {static_cast<uint8_t>(mode_)};
  switch (state_) {
    case State::kAwaitChallenge: {
      if (in.kind != schema::NetEnvelope::CHALLENGE || in.nonce.size() != kNonceBytes)
        return make_error(Errc::kInvalidArgument,
                          "the listener is not a kvrelay receiver of this version (no challenge)");
      if (in.mode != static_cast<uint8_t>(mode_))
        return make_error(
            Errc::kInvalidArgument,
            fmt::format("the listener protects its sessions with mode {}, this side with '{}': "
                        "give both instances the same --net-protection",
                        in.mode, protection_name(mode_)));
      server_nonce_ = in.nonce;
      nonce_ = random_nonce();
      encode_proof(nonce_, mode_, key_.mac(kConnectLabel, {server_nonce_, nonce_, modes}),
                   step.send_plain);
      state_ = State::kAwaitServerProof;
      return step;
    }
    case State::kAwaitServerProof:
      if (in.kind != schema::NetEnvelope::SERVER_PROOF)
        return make_error(Errc::kInvalidArgument,
                          "the listener did not prove it holds the key (it refused ours: a "
                          "different key there?)");
      if (!key_.verify(kAcceptLabel, {nonce_, server_nonce_, modes}, in.mac))
        return make_error(Errc::kInvalidArgument,
                          "the listener could not prove it holds the key (a different key there, "
                          "or not the peer it claims to be)");
      step.start_session = derive_session_keys(key_, server_nonce_, nonce_, mode_);
      encode_hello(hello_, step.send_sealed);
      state_ = State::kAwaitHelloAck;
      return step;
    case State::kAwaitHelloAck:
      if (in.kind == schema::NetEnvelope::HEARTBEAT) return step;  // a quiet line
      if (in.kind != schema::NetEnvelope::HELLO_ACK)
        return make_error(Errc::kInvalidArgument, "the receiver did not answer the hello");
      if (!in.hello_ack.accepted)
        return make_error(
            Errc::kInvalidArgument,
            fmt::format("the receiver refused the connection: {}", in.hello_ack.reason));
      ack_ = in.hello_ack;
      state_ = State::kDone;
      step.done = true;
      return step;
    case State::kDone: break;
  }
  return make_error(Errc::kInvalidArgument, "a handshake message after the handshake");
}

}  // namespace kvrelay::worker::net
