#include "kernels/copy_slice.h"

#include <algorithm>

namespace kvrelay::kernels {

void append_slices(const std::byte* src, std::byte* dst, std::span<const CopyRun> runs,
                   std::vector<CopySlice>& out, uint64_t max_slice) {
  max_slice = std::max<uint64_t>(16, max_slice & ~uint64_t{15});
  for (const CopyRun& r : runs) {
    const auto s = reinterpret_cast<uint64_t>(src) + r.src_offset;
    const auto d = reinterpret_cast<uint64_t>(dst) + r.dst_offset;
    for (uint64_t done = 0; done < r.bytes; done += max_slice)
      out.push_back(CopySlice{s + done, d + done, std::min(max_slice, r.bytes - done)});
  }
}

}  // namespace kvrelay::kernels
