#include <cstring>

#include "kernels/block_copy.h"

namespace kvrelay::kernels {

void copy_runs_host(const std::byte* src_base, std::byte* dst_base, std::span<const CopyRun> runs) {
  for (const CopyRun& r : runs)
    std::memcpy(dst_base + r.dst_offset, src_base + r.src_offset, r.bytes);
}

uint64_t run_bytes(std::span<const CopyRun> runs) {
  uint64_t total = 0;
  for (const CopyRun& r : runs)
    total += r.bytes;
  return total;
}

}  // namespace kvrelay::kernels
