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
  // Values below 2 * kHistogramSubBuckets map to themselves; above, `shift`
  // low bits are dropped so that 32..63 remain, and each shift gets 32 buckets.
  const int width = std::bit_width(value);
  const int shift = std::max(0, width - static_cast<int>(kHistogramSubBucketBits) - 1);
  return static_cast<uint32_t>(shift) * kHistogramSubBuckets +
         static_cast<uint32_t>(value >> shift);
}

uint64_t bucket_lower_bound(uint32_t bucket) {
  bucket = std::min(bucket, kHistogramBuckets - 1);
  if (bucket < 2 * kHistogramSubBuckets) return bucket;
  const uint32_t shift = bucket / kHistogramSubBuckets - 1;
  const uint64_t mantissa = bucket - shift * kHistogramSubBuckets;  // 32..63
  return mantissa << shift;
}

uint64_t bucket_upper_bound(uint32_t bucket) {
  bucket = std::min(bucket, kHistogramBuckets - 1);
  if (bucket < 2 * kHistogramSubBuckets) return bucket;
  const uint32_t shift = bucket / kHistogramSubBuckets - 1;
  return bucket_lower_bound(bucket) + ((uint64_t{1} << shift) - 1);
}

void CounterWriter::record(uint32_t histogram, uint64_t value) {
  Histogram& h = b_->histograms[histogram % kMaxHistograms];
  auto bump = [](std::atomic<uint64_t>& a, uint64_t n) {
    a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  };
  bump(h.buckets[histogram_bucket(value)], 1);
  bump(h.count, 1);
  bump(h.sum, value);
  if (value > h.max.load(std::memory_order_relaxed)) h.max.store(value, std::memory_order_relaxed);
}

void record_shared(CountersBlock& block, uint32_t histogram, uint64_t value) {
  Histogram& h = block.histograms[histogram % kMaxHistograms];
  h.buckets[histogram_bucket(value)].fetch_add(1, std::memory_order_relaxed);
  h.count.fetch_add(1, std::memory_order_relaxed);
  h.sum.fetch_add(value, std::memory_order_relaxed);
  uint64_t seen = h.max.load(std::memory_order_relaxed);
  while (value > seen && !h.max.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

uint64_t HistogramSnapshot::quantile(double q) const {
  uint64_t total = 0;
  for (uint64_t b : buckets)
    total += b;
  if (total == 0) return 0;
  const auto rank = std::max<uint64_t>(
      static_cast<uint64_t>(std::ceil(q * static_cast<double>(total))), 1);
  if (rank >= total) return max;  // the largest sample is known exactly
  uint64_t seen = 0;
  for (uint32_t b = 0; b < buckets.size(); ++b) {
    seen += buckets[b];
    if (seen >= rank) {
      const uint64_t lo = bucket_lower_bound(b);
      return std::min(lo + (bucket_upper_bound(b) - lo) / 2, max);
    }
  }
  return max;
}

void HistogramSnapshot::merge(const HistogramSnapshot& other) {
  for (size_t b = 0; b < buckets.size() && b < other.buckets.size(); ++b)
    buckets[b] += other.buckets[b];
  count += other.count;
  sum += other.sum;
  max = std::max(max, other.max);
}

void HistogramSnapshot::subtract(const HistogramSnapshot& earlier) {
  // Values only grow, but a reader's two snapshots may see a histogram mid
  // update: never let a bucket wrap below zero.
  auto minus = [](uint64_t a, uint64_t b) { return a > b ? a - b : 0; };
  for (size_t b = 0; b < buckets.size() && b < earlier.buckets.size(); ++b)
    buckets[b] = minus(buckets[b], earlier.buckets[b]);
  count = minus(count, earlier.count);
  sum = minus(sum, earlier.sum);
  // The max of the difference is unknown; the largest non-empty bucket bounds it.
  uint64_t top = 0;
  for (size_t b = 0; b < buckets.size(); ++b)
    if (buckets[b] != 0) top = std::min(bucket_upper_bound(static_cast<uint32_t>(b)), max);
  max = top;
}

Quantiles quantiles_of(const HistogramSnapshot& h) {
  return Quantiles{h.count,          h.quantile(0.5),   h.quantile(0.9),
                   h.quantile(0.99), h.quantile(0.999), h.max};
}

HistogramSnapshot snapshot_histogram(const CountersBlock& block, uint32_t index) {
  HistogramSnapshot h;
  if (index >= std::min(block.histogram_count, kMaxHistograms)) return h;
  h.label = read_label(block.histogram_labels[index]);
  h.unit = read_label(block.histogram_units[index]);
  const Histogram& src = block.histograms[index];
  for (uint32_t b = 0; b < kHistogramBuckets; ++b)
    h.buckets[b] = src.buckets[b].load(std::memory_order_relaxed);
  h.count = src.count.load(std::memory_order_relaxed);
  h.sum = src.sum.load(std::memory_order_relaxed);
  h.max = src.max.load(std::memory_order_relaxed);
  return h;
}

CountersSnapshot snapshot_counters(const CountersBlock& block) {
  CountersSnapshot snap;
  const uint32_t counters = std::min(block.counter_count, kMaxCounters);
  for (uint32_t i = 0; i < counters; ++i) {
    snap.counters.emplace_back(read_label(block.counter_labels[i]),
                               block.values[i].load(std::memory_order_relaxed));
  }
  const uint32_t histograms = std::min(block.histogram_count, kMaxHistograms);
  for (uint32_t i = 0; i < histograms; ++i)
    snap.histograms.push_back(snapshot_histogram(block, i));
  return snap;
}

}  // namespace kvrelay
