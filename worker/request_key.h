// The 64-bit name of a request id on the data plane: what a tcp frame and an
// ipc landed record name their request by, and what the decode side's claims
// and expected requests are keyed by. FNV-1a 64, never 0.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvrelay::worker {

inline uint64_t request_key(std::string_view request_id) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : request_id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

}  // namespace kvrelay::worker
