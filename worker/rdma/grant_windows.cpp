#include "worker/rdma/grant_windows.h"

namespace kvrelay::worker::rdma {

bool GrantedRunKeys::holds(size_t run, uint64_t offset, uint64_t length) const {
  if (run >= runs_.size()) return false;
  const uint64_t begin = runs_[run].dst_block * block_bytes_;
  const uint64_t end = (uint64_t{runs_[run].dst_block} + runs_[run].count) * block_bytes_;
  return offset >= begin && offset < end && length <= end - offset;
}

std::optional<uint32_t> GrantedRunKeys::next(uint64_t offset, uint64_t length) {
  if (!holds(current_, offset, length)) {
    if (!holds(current_ + 1, offset, length)) return std::nullopt;
    ++current_;
  }
  return rkeys_[current_ * tensors_ + slot_];
}

}  // namespace kvrelay::worker::rdma
