#include "worker/request_key.h"

#include <cstring>

#include "instance/auth_key.h"

namespace kvrelay::worker {

uint64_t request_key(std::string_view request_id, uint64_t nonce) {
  if (nonce == 0) return request_key(request_id);
  uint8_t secret[sizeof nonce];
  std::memcpy(secret, &nonce, sizeof nonce);
  const Mac mac = hmac_sha256(
      secret, "kvrelay-request-key",
      {std::span(reinterpret_cast<const uint8_t*>(request_id.data()), request_id.size())});
  uint64_t key = 0;
  std::memcpy(&key, mac.data(), sizeof key);
  return key == 0 ? 1 : key;
}

}  // namespace kvrelay::worker
