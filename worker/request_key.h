// The 64-bit name of a request on the data plane: what a network frame, an
// rdma intent and an ipc landed record name their request by, and what the
// decode side's claims and expected requests are keyed by. Never 0.
//
// Without a nonce it is FNV-1a 64 of the id, which anyone can compute. With
// the nonce the two engines share for the request (CacheDest.requestNonce,
// ExpectArrival.requestNonce) it is the first 8 bytes of
// HMAC-SHA256(nonce, id): a peer that holds the network key but not the
// nonce cannot name the request, so it can neither fill, fail nor complete
// it.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvrelay::worker {

inline uint64_t request_key(std::string_view request_id) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a 64's offset basis
  for (unsigned char c : request_id) {
    h ^= c;
    h *= 1099511628211ull;  // FNV's 64-bit prime
  }
  return h == 0 ? 1 : h;
}

// As above, keyed by `nonce` when it is not 0.
uint64_t request_key(std::string_view request_id, uint64_t nonce);

}  // namespace kvrelay::worker
