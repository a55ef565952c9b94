// Bytes that differ from their neighbours and from another seed's, for
// checking that a copy put each byte where it belongs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvrelay::testing {

inline std::vector<std::byte> byte_pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 131 + seed) & 0xFF);
  return v;
}

}  // namespace kvrelay::testing
