// The connecting side's half of a connection's handshake (envelope.h):
// answer the listener's challenge with a proof, check the listener's proof
// that it holds the key too, and only then start the session (sealed from
// there on: session_seal.h), say hello and read the listener's helloAck.
// Nothing about this side (its instance, rank or pool) goes out before the
// listener proved the key. The tcp transport's lanes and the rdma
// transport's sessions both use it (client_channel.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "instance/auth_key.h"
#include "shm/result.h"
#include "worker/net/envelope.h"
#include "worker/net/session_seal.h"

namespace kvrelay::worker::net {

// What one message of the handshake asks the channel to do, in this order.
struct HandshakeStep {
  std::vector<std::byte> send_plain;         // send, unsealed
  std::optional<SessionKeys> start_session;  // then seal everything from here on
  std::vector<std::byte> send_sealed;        // then send this, sealed
  bool done = false;                         // the handshake is over
};

class ClientHandshake {
 public:
  ClientHandshake(const AuthKey& key, Protection mode, Hello hello)
      : key_(key), mode_(mode), hello_(std::move(hello)) {}

  // Feeds one envelope received before the handshake is over: the next step,
  // or why the connection must be closed. Once done, ack() holds the
  // listener's acceptance.
  Result<HandshakeStep> on_message(const Inbound& in);
  const HelloAck& ack() const { return ack_; }
  // The proof went out and the listener has not answered it yet.
  bool awaiting_server_proof() const { return state_ == State::kAwaitServerProof; }

 private:
  enum class State { kAwaitChallenge, kAwaitServerProof, kAwaitHelloAck, kDone };
  const AuthKey& key_;
  Protection mode_;
  Hello hello_;
  State state_ = State::kAwaitChallenge;
  std::vector<uint8_t> server_nonce_;
  Nonce nonce_{};
  HelloAck ack_;
};

}  // namespace kvrelay::worker::net
