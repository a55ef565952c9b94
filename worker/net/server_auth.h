// The accepting side's half of a connection's handshake (envelope.h):
// challenge, check the connecting side's proof of the key, prove the key in
// turn, start the session (sealed from there on: session_seal.h), and take
// the sealed hello. Before the proof nothing but a proof is accepted, and
// nothing about this side (its pool, its instance) is said: a peer without
// the key learns only that this is a kvrelay listener.
#pragma once

#include <optional>
#include <vector>

#include "instance/auth_key.h"
#include "shm/result.h"
#include "worker/net/client_auth.h"
#include "worker/net/envelope.h"
#include "worker/net/session_seal.h"

namespace kvrelay::worker::net {

class ServerHandshake {
 public:
  ServerHandshake(const AuthKey& key, Protection mode) : key_(key), mode_(mode) {}

  // The first message: the challenge.
  void challenge(std::vector<std::byte>& out);
  // Feeds one envelope received before the hello: the next step, or why the
  // connection must be closed (logged by the caller; nothing is answered).
  // Once `hello()` holds a value, the listener answers it with a helloAck.
  Result<HandshakeStep> on_message(const Inbound& in);
  const std::optional<Hello>& hello() const { return hello_; }
  bool proved() const { return state_ != State::kAwaitProof; }

 private:
  enum class State { kAwaitProof, kAwaitHello, kDone };
  const AuthKey& key_;
  Protection mode_;
  State state_ = State::kAwaitProof;
  Nonce nonce_{};
  std::optional<Hello> hello_;
};

}  // namespace kvrelay::worker::net
