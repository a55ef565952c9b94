#include "worker/rdma/grant_windows.h"

#include <algorithm>
#include <iterator>

namespace kvrelay::worker::rdma {

void windows_of(std::span<const BlockRun> runs, std::span<const uint32_t> rkeys, uint32_t slot,
                uint32_t tensors, uint64_t block_bytes, std::vector<GrantWindow>& out) {
  out.clear();
  for (size_t r = 0; r < runs.size(); ++r)
    out.push_back({runs[r].dst_block * block_bytes,
                   (uint64_t{runs[r].dst_block} + runs[r].count) * block_bytes,
                   rkeys[r * tensors + slot]});
  std::sort(out.begin(), out.end(),
            [](const GrantWindow& a, const GrantWindow& b) { return a.begin < b.begin; });
}

std::optional<uint32_t> key_for(std::span<const GrantWindow> windows, uint64_t offset,
                                uint64_t length) {
  // The last window that begins at or before `offset`: runs of one transfer
  // do not overlap, so no other can hold it.
  auto after = std::upper_bound(windows.begin(), windows.end(), offset,
                                [](uint64_t o, const GrantWindow& w) { return o < w.begin; });
  if (after == windows.begin()) return std::nullopt;
  const GrantWindow& w = *std::prev(after);
  if (length > w.end - offset || offset >= w.end) return std::nullopt;
  return w.rkey;
}

}  // namespace kvrelay::worker::rdma
