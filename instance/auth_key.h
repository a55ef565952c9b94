// The pre-shared key that tcp connections authenticate with (challenge and
// response, both ways), so that a listener writing into an engine's KV cache
// accepts writes only from a peer that holds the key, and a sender sends KV
// data only to such a peer.
//
// The key is a file of 32 or more random bytes that only its owner may read
// (mode 0600 or stricter), e.g. `head -c 32 /dev/urandom > kvrelay.key &&
// chmod 600 kvrelay.key`, copied to every host of the deployment (docs/transports.md:
// "Cross-host transfer"). The whole content is the key.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shm/result.h"

namespace kvrelay {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;  // HMAC-SHA256
inline constexpr size_t kMinKeyBytes = 16;
inline constexpr size_t kMaxKeyBytes = 4096;
// A key must carry about this many bits by the estimate of its alphabet
// (check_key_strength), and have at least this many distinct byte values.
inline constexpr unsigned kMinKeyBits = 128;
inline constexpr size_t kMinDistinctKeyBytes = 8;

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// What each side proves it can compute: the labels keep a connecting side's
// proof from being replayed as an accepting side's (and version 1's proofs
// from counting in version 2).
inline constexpr std::string_view kConnectLabel = "kvrelay-net-v2 connect";
inline constexpr std::string_view kAcceptLabel = "kvrelay-net-v2 accept";
inline constexpr std::string_view kSessionLabel = "kvrelay-net-v2 session";

class AuthKey {
 public:
  // Reads a key file. Refuses (naming the file and what to do) one that is
  // not a regular file, belongs to another user, can be read by group or
  // others, is shorter than kMinKeyBytes, or is obviously weak
  // (check_key_strength). A symbolic link is followed, and its target is
  // what must pass.
  static Result<AuthKey> load(const std::string& path);
  static AuthKey from_bytes(std::vector<uint8_t> bytes) { return AuthKey(std::move(bytes)); }

  // HMAC-SHA256(key, label || parts...).
  Mac mac(std::string_view label, std::initializer_list<std::span<const uint8_t>> parts) const;
  // Whether `proof` is that MAC; compares in constant time.
  bool verify(std::string_view label, std::initializer_list<std::span<const uint8_t>> parts,
              std::span<const uint8_t> proof) const;

 private:
  explicit AuthKey(std::vector<uint8_t> bytes) : key_(std::move(bytes)) {}
  std::vector<uint8_t> key_;
};

// Ok, or why `key` (read from `path`) is obviously weak: fewer than
// kMinDistinctKeyBytes distinct bytes, or fewer than kMinKeyBits by the
// estimate of its alphabet (a 16-character password, hex of 16 bytes).
Status check_key_strength(std::span<const uint8_t> key, const std::string& path);

// Random bytes from the system's CSPRNG.
Nonce random_nonce();

// HMAC-SHA256(key, label || parts...), for keys that are not a file's
// (the session keys derived from one).
Mac hmac_sha256(std::span<const uint8_t> key, std::string_view label,
                std::initializer_list<std::span<const uint8_t>> parts);

}  // namespace kvrelay
