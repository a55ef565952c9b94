// Exact quantiles of a run's own samples, and the one way the simulator
// prints them (p50 / p90 / p99 / p99.9 / max, as kvrelay-dump does).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "shm/counters.h"

namespace kvrelay::sim {

// The nearest-rank quantiles of `v` (ns).
inline Quantiles exact_quantiles(std::vector<uint64_t> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
  };
  return Quantiles{v.size(), at(0.5), at(0.9), at(0.99), at(0.999), v.back()};
}

// A run where nothing qualified (every exposed time excluded: each request's
// decode half came after its prefill) says so, rather than print zeros that
// read as a measurement.
inline std::string us_quantiles(const Quantiles& q) {
  if (q.count == 0) return "none measured (no request qualified)";
  return fmt::format("p50 {:.1f} us, p90 {:.1f} us, p99 {:.1f} us, p99.9 {:.1f} us, max {:.1f} us",
                     q.p50 / 1e3, q.p90 / 1e3, q.p99 / 1e3, q.p999 / 1e3, q.max / 1e3);
}

}  // namespace kvrelay::sim
