// Integer helpers shared by the layouts and rings.
#pragma once

#include <cstdint>

namespace kvrelay {

constexpr bool is_pow2(uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}
// Rounds v up to a multiple of a (a power of two).
constexpr uint64_t align_up(uint64_t v, uint64_t a) {
  return (v + a - 1) & ~(a - 1);
}

}  // namespace kvrelay
