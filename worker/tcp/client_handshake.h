// The connecting side's half of a tcp control connection's handshake
// (wire.h): answer the listener's challenge with a proof and a hello, then
// check its helloAck (accepted, and proof that it holds the key too). The
// tcp transport's lanes and the rdma transport's sessions both use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "instance/auth_key.h"
#include "shm/result.h"
#include "worker/tcp/wire.h"

namespace kvrelay::worker::tcp {

// What a sending rank says in its hello.
inline Hello make_hello(const std::string& instance, const std::string& expected_instance,
                        uint32_t rank, uint32_t tp_size, const PoolGeometry& pool,
                        uint32_t total_kv_heads = 0) {
  Hello h;
  h.version = kWireVersion;
  h.instance = instance;
  h.expected_instance = expected_instance;
  h.rank = rank;
  h.tp_size = tp_size;
  h.total_kv_heads = total_kv_heads;
  h.pool = pool;
  return h;
}

class ClientHandshake {
 public:
  ClientHandshake(const AuthKey& key, Hello hello) : key_(key), hello_(std::move(hello)) {}

  // Feeds one envelope received before the handshake is over. Appends to
  // `reply` what must be sent. Returns true once the listener has accepted
  // (ack() then holds its answer), false while more must be read, or why the
  // connection must be closed.
  Result<bool> on_message(const Inbound& in, std::vector<std::byte>& reply);
  const HelloAck& ack() const { return ack_; }

 private:
  const AuthKey& key_;
  Hello hello_;
  bool challenged_ = false;
  std::vector<uint8_t> server_nonce_;
  std::vector<uint8_t> nonce_;
  HelloAck ack_;
};

}  // namespace kvrelay::worker::tcp
