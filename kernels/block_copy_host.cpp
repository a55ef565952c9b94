#include <algorithm>
#include <cstring>

#include "kernels/block_copy.h"
#include "kernels/run_order.h"
#include "kernels/streaming_copy.h"

namespace kvrelay::kernels {

void copy_runs_host(const std::byte* src_base, std::byte* dst_base, std::span<const CopyRun> runs,
                    bool stream) {
  const RunsBetween one{src_base, dst_base, runs};
  copy_runs_host_interleaved(std::span<const RunsBetween>(&one, 1), stream);
}

void copy_runs_host_interleaved(std::span<const RunsBetween> lists, bool stream) {
  const std::span<const uint32_t> order = source_order(lists);
  bool streamed = false;
  size_t longest = 0;
  for (const RunsBetween& l : lists)
    longest = std::max(longest, l.runs.size());
  for (size_t step = 0; step < longest; ++step) {
    const size_t i = order.empty() ? step : order[step];
    for (const RunsBetween& l : lists) {
      if (i >= l.runs.size()) continue;
      const CopyRun& r = l.runs[i];
      if (stream && r.bytes >= kStreamingRunBytes) {
        streaming_copy(l.dst_base + r.dst_offset, l.src_base + r.src_offset, r.bytes);
        streamed = true;
      } else {
        std::memcpy(l.dst_base + r.dst_offset, l.src_base + r.src_offset, r.bytes);
      }
    }
  }
  // The caller reports the copy done next (a release store at most): it
  // must not become visible before the streamed bytes.
  if (streamed) streaming_copy_fence();
}

uint64_t run_bytes(std::span<const CopyRun> runs) {
  uint64_t total = 0;
  for (const CopyRun& r : runs)
    total += r.bytes;
  return total;
}

}  // namespace kvrelay::kernels
