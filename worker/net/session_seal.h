// The protection of a session once both ends have proved the pre-shared key
// (client_auth.h, server_auth.h): every record that follows, envelope or
// payload, carries a 16-byte AES-256-GCM tag, and in the encrypting mode is
// encrypted too. So a relay that forwarded the handshake holds nothing it can
// use, and a byte injected, altered, dropped, replayed or reordered on the
// wire fails the next tag, which closes the connection.
//
//   keys    prk     = HMAC-SHA256(psk, "kvrelay-net-v2 session" || nonce_s || nonce_c || modes)
//           send    = HMAC-SHA256(prk, "client->server") or "server->client", per direction:
//                     a record reflected back to its sender fails
//   nonce   12 bytes: 4 zero bytes, then the direction's record counter (little-endian,
//           64 bits; it never wraps): a replayed or reordered record fails
//   record  an envelope: its length prefix is authenticated, its body authenticated
//           (kAuthenticate) or encrypted (kEncrypt); a payload likewise, as one record
//           however it is cut into reads and writes
//
// The hello and its ack are the first records under these keys, so both
// hellos are bound to the session as well.
//
// kAuthenticate leaves the bytes readable on the wire but costs one GHASH
// pass (several GB/s a core) and no copy: the sender authenticates a
// payload straight from the pool. kEncrypt costs an AES-GCM pass and, on the
// sending side, a copy through a bounce buffer (pool memory is never
// encrypted in place). Every connection (tcp lane) seals on its own strand,
// so lanes protect in parallel.
//
// Not thread-safe: one Sealer per direction of one connection.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "instance/auth_key.h"
#include "worker/net/envelope.h"

namespace kvrelay::worker::net {

inline constexpr size_t kTagBytes = 16;
using Tag = std::array<uint8_t, kTagBytes>;
using SessionKey = std::array<uint8_t, 32>;

struct SessionKeys {
  SessionKey client_to_server{};
  SessionKey server_to_client{};
};
// Both ends compute the same keys from the key, both nonces and both modes.
SessionKeys derive_session_keys(const AuthKey& key, std::span<const uint8_t> server_nonce,
                                std::span<const uint8_t> client_nonce, Protection mode);

// One direction's records, in order. Each record is sealed by begin(),
// any number of add() calls, then finish(); the record counter advances
// with each.
class RecordSeal {
 public:
  enum class Side { kSend, kReceive };
  RecordSeal(const SessionKey& key, Protection mode, Side side);
  ~RecordSeal();
  RecordSeal(const RecordSeal&) = delete;
  RecordSeal& operator=(const RecordSeal&) = delete;

  Protection mode() const { return mode_; }
  uint64_t records() const { return counter_; }

  void begin();
  // Bytes covered but never encrypted (an envelope's length prefix).
  void add_plain(std::span<const std::byte> bytes);
  // The record's data: authenticated; with kEncrypt, sending encrypts from
  // `in` to `out`, receiving decrypts `in` into `out` (`out` may be `in`).
  // With kAuthenticate `out` is not written.
  void add(std::span<const std::byte> in, std::byte* out);
  // Sending: the tag to send after the record.
  Tag finish_send();
  // Receiving: whether `tag` is the record's; false means it was altered.
  [[nodiscard]] bool finish_receive(std::span<const uint8_t, kTagBytes> tag);

 private:
  struct Cipher;
  std::unique_ptr<Cipher> cipher_;
  Protection mode_;
  Side side_;
  uint64_t counter_ = 0;
  bool data_started_ = false;  // GCM takes every plain byte before the first encrypted one
};

}  // namespace kvrelay::worker::net
