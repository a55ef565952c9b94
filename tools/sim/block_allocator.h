// A pool's free blocks, handed out the way an engine's block manager does:
// after some churn, a request's blocks are a mix of consecutive runs and
// scattered ids, which is what the copy planner must cope with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <vector>

namespace kvrelay::sim {

class BlockAllocator {
 public:
  BlockAllocator(uint32_t blocks, uint64_t seed) : rng_(seed) {
    for (uint32_t b = 0; b < blocks; ++b)
      free_.push_back(b);
  }
  // `n` blocks, or nullopt when fewer are free.
  std::optional<std::vector<uint32_t>> take(uint32_t n) {
    if (free_.size() < n) return std::nullopt;
    std::vector<uint32_t> out(free_.begin(), free_.begin() + n);
    free_.erase(free_.begin(), free_.begin() + n);
    return out;
  }
  // Returns blocks; a random part goes to the back, so later requests see
  // both consecutive and scattered ids.
  void give_back(const std::vector<uint32_t>& blocks) {
    for (uint32_t b : blocks) {
      if (rng_() % 2 == 0) {
        free_.push_back(b);
      } else {
        free_.push_front(b);
      }
    }
  }
  size_t free_blocks() const { return free_.size(); }

 private:
  std::deque<uint32_t> free_;
  std::mt19937_64 rng_;
};

}  // namespace kvrelay::sim
