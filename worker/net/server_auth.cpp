#include "worker/net/server_auth.h"

#include <fmt/format.h>

namespace kvrelay::worker::net {

void ServerHandshake::challenge(std::vector<std::byte>& out) {
  nonce_ = random_nonce();
  encode_challenge(nonce_, mode_, out);
}

Result<HandshakeStep> ServerHandshake::on_message(const Inbound& in) {
  HandshakeStep step;
  const uint8_t modes[1] = {static_cast<uint8_t>(mode_)};
  switch (state_) {
    case State::kAwaitProof:
      if (in.kind != schema::NetEnvelope::PROOF)
        return make_error(Errc::kInvalidArgument,
                          "it sent something other than a proof of the key");
      if (in.mode != static_cast<uint8_t>(mode_))
        return make_error(
            Errc::kInvalidArgument,
            fmt::format("it protects its sessions with mode {}, this listener with '{}' (give both "
                        "instances the same --net-protection)",
                        in.mode, protection_name(mode_)));
      if (in.nonce.size() != kNonceBytes ||
          !key_.verify(kConnectLabel, {nonce_, in.nonce, modes}, in.mac))
        return make_error(Errc::kInvalidArgument, "authentication failed (wrong or missing key)");
      encode_server_proof(key_.mac(kAcceptLabel, {in.nonce, nonce_, modes}), step.send_plain);
      step.start_session = derive_session_keys(key_, nonce_, in.nonce, mode_);
      state_ = State::kAwaitHello;
      return step;
    case State::kAwaitHello:
      if (in.kind == schema::NetEnvelope::HEARTBEAT) return step;
      if (in.kind != schema::NetEnvelope::HELLO)
        return make_error(Errc::kInvalidArgument, "it sent no hello");
      hello_ = in.hello;
      state_ = State::kDone;
      step.done = true;
      return step;
    case State::kDone: break;
  }
  return make_error(Errc::kInvalidArgument, "a handshake message after the handshake");
}

}  // namespace kvrelay::worker::net
