#include "kernels/run_order.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace kvrelay::kernels {

std::span<const uint32_t> source_order(std::span<const RunsBetween> lists) {
  thread_local std::vector<std::pair<uint64_t, uint32_t>> by_source;
  thread_local std::vector<uint32_t> order;
  if (lists.empty()) return {};
  const std::span<const CopyRun> first = lists.front().runs;
  if (first.size() < kSortRunsFrom || first.size() > UINT32_MAX) return {};
  for (const RunsBetween& l : lists)
    if (l.runs.size() != first.size()) return {};
  bool in_order = true;
  uint64_t lowest = UINT64_MAX, end = 0, bytes = 0;
  for (size_t i = 0; i < first.size(); ++i) {
    const CopyRun& r = first[i];
    if (i > 0 && r.src_offset < first[i - 1].src_offset) in_order = false;
    lowest = std::min(lowest, r.src_offset);
    end = std::max(end, r.src_offset + r.bytes);
    bytes += r.bytes;
  }
  if (in_order || bytes < (end - lowest) / 4) return {};
  // Pairs sort faster than indices compared through the runs (no indirect
  // loads); ties keep the request's order.
  by_source.resize(first.size());
  for (size_t i = 0; i < first.size(); ++i)
    by_source[i] = {first[i].src_offset, static_cast<uint32_t>(i)};
  std::sort(by_source.begin(), by_source.end());
  order.resize(first.size());
  for (size_t i = 0; i < first.size(); ++i)
    order[i] = by_source[i].second;
  return order;
}

}  // namespace kvrelay::kernels
