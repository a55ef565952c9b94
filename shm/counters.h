// A block of monotonic u64 counters and log-linear latency histograms in
// shared memory, one block per process, readable by anyone (kvrelay-dump) without
// stopping the writer.
//
// Labels live in the block itself (as in Aeron's counters file), so a reader
// needs no knowledge of what the writer counts.
//
// Who may call what: the owning process defines the labels once (before it
// publishes the block) and updates the values with CounterWriter, which uses
// plain load+store (no lock prefix) because it is the only writer. A block
// shared by several writers (all clients of an instance) must use add_shared.
// Readers take a snapshot: every value is read atomically, and values only
// grow, so a snapshot is never torn within a value; a histogram's buckets may
// be a few samples apart from each other.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvrelay {

inline constexpr uint32_t kMaxCounters = 48;
inline constexpr uint32_t kMaxHistograms = 12;
// Log-linear buckets (HdrHistogram's idea): values below 64 have a bucket
// each; every power-of-two range above is cut into 32 equal buckets. A
// bucket is thus never wider than 1/32 of the values it holds, and its
// midpoint, which quantiles report, is within 1.6% of any of them. The range
// is all of u64 (1920 buckets, 15 KiB a histogram).
inline constexpr uint32_t kHistogramSubBucketBits = 5;
inline constexpr uint32_t kHistogramSubBuckets = 1U << kHistogramSubBucketBits;
inline constexpr uint32_t kHistogramBuckets = (64 - kHistogramSubBucketBits) * kHistogramSubBuckets +
                                              kHistogramSubBuckets;  // 1920
inline constexpr uint32_t kLabelBytes = 48;

struct CounterLabel {
  char text[kLabelBytes];
};

struct alignas(64) Histogram {
  std::atomic<uint64_t> buckets[kHistogramBuckets];
  std::atomic<uint64_t> count;
  std::atomic<uint64_t> sum;
  std::atomic<uint64_t> max;
  uint64_t reserved[5];
};
static_assert(sizeof(Histogram) == kHistogramBuckets * 8 + 64);

struct alignas(64) CountersBlock {
  uint32_t counter_count;  // labels defined
  uint32_t histogram_count;
  uint8_t reserved[56];
  CounterLabel counter_labels[kMaxCounters];
  CounterLabel histogram_labels[kMaxHistograms];
  CounterLabel histogram_units[kMaxHistograms];  // e.g. "ns"
  std::atomic<uint64_t> values[kMaxCounters];
  Histogram histograms[kMaxHistograms];
};
static_assert(sizeof(CountersBlock) % 64 == 0);

// Sets up labels. Ids are dense, in the order given.
void define_counters(
    CountersBlock& block, const std::vector<std::string_view>& counter_labels,
    const std::vector<std::pair<std::string_view, std::string_view>>& histogram_labels_and_units);

// Single-writer updates (see top).
class CounterWriter {
 public:
  explicit CounterWriter(CountersBlock& block) : b_(&block) {}
  void add(uint32_t id, uint64_t n = 1) {
    auto& v = b_->values[id % kMaxCounters];
    v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  // Mirrors a count kept elsewhere (a component's own counters).
  void set(uint32_t id, uint64_t v) {
    b_->values[id % kMaxCounters].store(v, std::memory_order_relaxed);
  }
  void record(uint32_t histogram, uint64_t value);

 private:
  CountersBlock* b_;
};

// Multi-writer updates.
inline void add_shared(CountersBlock& block, uint32_t id, uint64_t n = 1) {
  block.values[id % kMaxCounters].fetch_add(n, std::memory_order_relaxed);
}
void record_shared(CountersBlock& block, uint32_t histogram, uint64_t value);

// Which bucket a value falls in (see kHistogramBuckets).
uint32_t histogram_bucket(uint64_t value);
// The smallest and the largest value bucket b holds (both inclusive).
uint64_t bucket_lower_bound(uint32_t bucket);
uint64_t bucket_upper_bound(uint32_t bucket);

struct HistogramSnapshot {
  std::string label;
  std::string unit;
  std::vector<uint64_t> buckets = std::vector<uint64_t>(kHistogramBuckets);
  uint64_t count = 0;
  uint64_t sum = 0;
  uint64_t max = 0;
  // The q-quantile (0 < q <= 1): the midpoint of the bucket that holds it,
  // so within 1.6% of the exact value, and never above `max` (q = 1: `max`).
  // 0 when empty.
  uint64_t quantile(double q) const;
  // Adds another histogram's samples (merging ranks, or a later snapshot
  // minus an earlier one with `subtract`).
  void merge(const HistogramSnapshot& other);
  void subtract(const HistogramSnapshot& earlier);
};

// The quantiles every report shows.
struct Quantiles {
  uint64_t count = 0, p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;
};
Quantiles quantiles_of(const HistogramSnapshot& h);

struct CountersSnapshot {
  std::vector<std::pair<std::string, uint64_t>> counters;
  std::vector<HistogramSnapshot> histograms;
};

CountersSnapshot snapshot_counters(const CountersBlock& block);
// One histogram only (its label and unit too); empty when `index` is undefined.
HistogramSnapshot snapshot_histogram(const CountersBlock& block, uint32_t index);

}  // namespace kvrelay
