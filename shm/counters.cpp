#include "shm/counters.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

namespace kvrelay {

namespace {

void set_label(CounterLabel& label, std::string_view text) {
  std::memset(label.text, 0, sizeof(label.text));
  std::memcpy(label.text, text.data(), std::min(text.size(), sizeof(label.text) - 1));
}

// Labels come from shared memory: never trust a terminator to be there.
std::string read_label(const CounterLabel& label) {
  const char* end = static_cast<const char*>(std::memchr(label.text, 0, sizeof(label.text)));
  return std::string(label.text, end != nullptr ? end : label.text + sizeof(label.text));
}

}  // namespace

void define_counters(
    CountersBlock& block, const std::vector<std::string_view>& counter_labels,
    const std::vector<std::pair<std::string_view, std::string_view>>& histogram_labels_and_units) {
  block.counter_count =
      static_cast<uint32_t>(std::min<size_t>(counter_labels.size(), kMaxCounters));
  for (uint32_t i = 0; i < block.counter_count; ++i)
    set_label(block.counter_labels[i], counter_labels[i]);
  block.histogram_count =
      static_cast<uint32_t>(std::min<size_t>(histogram_labels_and_units.size(), kMaxHistograms));
  for (uint32_t i = 0; i < block.histogram_count; ++i) {
    set_label(block.histogram_labels[i], histogram_labels_and_units[i].first);
    set_label(block.histogram_units[i], histogram_labels_and_units[i].second);
  }
}

uint32_t histogram_bucket(uint64_t value) {
  return value == 0 ? 0 : static_cast<uint32_t>(std::bit_width(value));  // 1..64
}

uint64_t bucket_upper_bound(uint32_t bucket) {
  if (bucket == 0) return 0;
  if (bucket >= 64) return UINT64_MAX;
  return (uint64_t{1} << bucket) - 1;
}

void CounterWriter::record(uint32_t histogram, uint64_t value) {
  Histogram& h = b_->histograms[histogram % kMaxHistograms];
  auto bump = [](std::atomic<uint64_t>& a, uint64_t n) {
    a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  };
  bump(h.buckets[std::min(histogram_bucket(value), kHistogramBuckets - 1)], 1);
  bump(h.count, 1);
  bump(h.sum, value);
  if (value > h.max.load(std::memory_order_relaxed)) h.max.store(value, std::memory_order_relaxed);
}

uint64_t HistogramSnapshot::quantile(double q) const {
  uint64_t total = 0;
  for (uint64_t b : buckets)
    total += b;
  if (total == 0) return 0;
  const auto rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total)));
  uint64_t seen = 0;
  for (uint32_t b = 0; b < kHistogramBuckets; ++b) {
    seen += buckets[b];
    if (seen >= std::max<uint64_t>(rank, 1)) return std::min(bucket_upper_bound(b), max);
  }
  return max;
}

CountersSnapshot snapshot_counters(const CountersBlock& block) {
  CountersSnapshot snap;
  const uint32_t counters = std::min(block.counter_count, kMaxCounters);
  for (uint32_t i = 0; i < counters; ++i) {
    snap.counters.emplace_back(read_label(block.counter_labels[i]),
                               block.values[i].load(std::memory_order_relaxed));
  }
  const uint32_t histograms = std::min(block.histogram_count, kMaxHistograms);
  for (uint32_t i = 0; i < histograms; ++i) {
    HistogramSnapshot h;
    h.label = read_label(block.histogram_labels[i]);
    h.unit = read_label(block.histogram_units[i]);
    const Histogram& src = block.histograms[i];
    for (uint32_t b = 0; b < kHistogramBuckets; ++b)
      h.buckets[b] = src.buckets[b].load(std::memory_order_relaxed);
    h.count = src.count.load(std::memory_order_relaxed);
    h.sum = src.sum.load(std::memory_order_relaxed);
    h.max = src.max.load(std::memory_order_relaxed);
    snap.histograms.push_back(std::move(h));
  }
  return snap;
}

}  // namespace kvrelay
