// Counters: labels, values and histograms, read by another process while the
// owner keeps writing.
#include "shm/counters.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "support/processes.h"

namespace kvrelay {
namespace {

using testing::SharedRegion;
using namespace std::chrono_literals;

TEST(Histogram, BucketsAreLogLinearAndTileTheWholeRange) {
  // Small values have a bucket each; above 64, 32 buckets per power of two.
  for (uint64_t v = 0; v < 64; ++v)
    EXPECT_EQ(histogram_bucket(v), v);
  EXPECT_EQ(histogram_bucket(64), 64u);
  EXPECT_EQ(histogram_bucket(65), 64u);
  EXPECT_EQ(histogram_bucket(66), 65u);
  EXPECT_EQ(histogram_bucket(UINT64_MAX), kHistogramBuckets - 1);
  // Adjacent buckets meet exactly, each holds what its bounds say, and no
  // bucket is wider than 1/32 of its smallest value.
  EXPECT_EQ(bucket_lower_bound(0), 0u);
  EXPECT_EQ(bucket_upper_bound(kHistogramBuckets - 1), UINT64_MAX);
  for (uint32_t b = 0; b < kHistogramBuckets; ++b) {
    const uint64_t lo = bucket_lower_bound(b), hi = bucket_upper_bound(b);
    ASSERT_LE(lo, hi) << b;
    ASSERT_EQ(histogram_bucket(lo), b);
    ASSERT_EQ(histogram_bucket(hi), b);
    if (b + 1 < kHistogramBuckets) {
      ASSERT_EQ(bucket_lower_bound(b + 1), hi + 1) << b;
    }
    if (lo >= 64) {
      ASSERT_LE(hi - lo + 1, lo / 32) << b;
    }
  }
}

TEST(Histogram, QuantilesAreWithinTwoPercentOfTheExactOnes) {
  SharedRegion mem(sizeof(CountersBlock));
  auto* block = new (mem.data()) CountersBlock{};
  define_counters(*block, {}, {{"latency", "ns"}});
  CounterWriter w(*block);
  std::mt19937_64 rng(7);
  std::vector<uint64_t> values;
  for (int i = 0; i < 20000; ++i) {
    // Log-uniform over 100 ns .. 100 ms, as latencies spread.
    const double e = std::uniform_real_distribution<double>(2, 8)(rng);
    values.push_back(static_cast<uint64_t>(std::pow(10.0, e)));
    w.record(0, values.back());
  }
  std::sort(values.begin(), values.end());
  const HistogramSnapshot h = snapshot_counters(*block).histograms.at(0);
  EXPECT_EQ(h.label, "latency");
  EXPECT_EQ(h.unit, "ns");
  EXPECT_EQ(h.count, values.size());
  EXPECT_EQ(h.max, values.back());
  for (double q : {0.01, 0.5, 0.9, 0.99, 0.999}) {
    const uint64_t exact = values[static_cast<size_t>(std::ceil(q * values.size())) - 1];
    const double error = std::abs(static_cast<double>(h.quantile(q)) - static_cast<double>(exact)) /
                         static_cast<double>(exact);
    EXPECT_LE(error, 0.016) << "q " << q << ": " << h.quantile(q) << " vs " << exact;
  }
  EXPECT_EQ(h.quantile(1.0), values.back()) << "capped by the true maximum";
  const Quantiles all = quantiles_of(h);
  EXPECT_EQ(all.count, values.size());
  EXPECT_LE(all.p50, all.p90);
  EXPECT_LE(all.p99, all.p999);
  EXPECT_LE(all.p999, all.max);
}

TEST(Histogram, SnapshotsMergeAndSubtract) {
  SharedRegion mem(sizeof(CountersBlock));
  auto* block = new (mem.data()) CountersBlock{};
  define_counters(*block, {}, {{"latency", "ns"}});
  CounterWriter w(*block);
  for (uint64_t v = 1; v <= 100; ++v)
    w.record(0, v * 1000);
  const HistogramSnapshot before = snapshot_counters(*block).histograms.at(0);
  for (int i = 0; i < 100; ++i)
    w.record(0, 5000);
  HistogramSnapshot during = snapshot_counters(*block).histograms.at(0);
  during.subtract(before);
  EXPECT_EQ(during.count, 100u);
  EXPECT_EQ(during.sum, 500'000u);
  EXPECT_NEAR(static_cast<double>(during.quantile(0.99)), 5000.0, 5000 * 0.016);
  EXPECT_LT(during.max, 5200u) << "the max of the difference is its top bucket's, not the whole max";
  HistogramSnapshot merged = before;
  merged.merge(during);
  EXPECT_EQ(merged.count, 200u);
  EXPECT_EQ(merged.max, 100'000u);
}

TEST(Histogram, SharedWritersLoseNoSample) {
  SharedRegion mem(sizeof(CountersBlock));
  auto* block = new (mem.data()) CountersBlock{};
  define_counters(*block, {}, {{"latency", "ns"}});
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t)
    writers.emplace_back([&, t] {
      for (uint64_t i = 0; i < 10000; ++i)
        record_shared(*block, 0, 100 + t * 1000 + (i % 7));
    });
  for (auto& t : writers)
    t.join();
  const HistogramSnapshot h = snapshot_counters(*block).histograms.at(0);
  EXPECT_EQ(h.count, 40000u);
  uint64_t in_buckets = 0;
  for (uint64_t b : h.buckets)
    in_buckets += b;
  EXPECT_EQ(in_buckets, 40000u);
  EXPECT_EQ(h.max, 3106u);
}

TEST(Counters, LongLabelsAreCutNotOverrun) {
  SharedRegion mem(sizeof(CountersBlock));
  auto* block = new (mem.data()) CountersBlock{};
  const std::string long_label(200, 'x');
  define_counters(*block, {long_label}, {});
  EXPECT_EQ(snapshot_counters(*block).counters.at(0).first, std::string(kLabelBytes - 1, 'x'));
}

// A writer process counts as fast as it can; this process takes snapshots
// meanwhile. Every counter is monotonic across snapshots and the histogram
// count never goes backwards: a reader never stops or confuses the writer.
TEST(CountersProcesses, SnapshotsWhileAnotherProcessWritesAreMonotonic) {
  SharedRegion mem(sizeof(CountersBlock));
  auto* block = new (mem.data()) CountersBlock{};
  define_counters(*block, {"requests", "bytes"}, {{"latency", "ns"}});
  const pid_t writer = testing::fork_child([&] {
    CounterWriter w(*block);
    for (uint64_t i = 0;; ++i) {
      w.add(0);
      w.add(1, 4096);
      w.record(0, i % 100'000);
    }
    return 0;
  });
  uint64_t last_requests = 0, last_bytes = 0, last_count = 0;
  int increases = 0;
  for (int i = 0; i < 2000; ++i) {
    const CountersSnapshot s = snapshot_counters(*block);
    ASSERT_EQ(s.counters.size(), 2u);
    EXPECT_EQ(s.counters[0].first, "requests");
    EXPECT_GE(s.counters[0].second, last_requests);
    EXPECT_GE(s.counters[1].second, last_bytes);
    EXPECT_GE(s.histograms[0].count, last_count);
    if (s.counters[0].second > last_requests) ++increases;
    last_requests = s.counters[0].second;
    last_bytes = s.counters[1].second;
    last_count = s.histograms[0].count;
    usleep(100);
  }
  testing::kill_child(writer);
  EXPECT_GT(increases, 10) << "the writer made progress while being read";
  // The kill may land between the two adds of one iteration, never inside one.
  const uint64_t requests = block->values[0].load();
  const uint64_t bytes = block->values[1].load();
  EXPECT_TRUE(bytes == requests * 4096 || bytes == (requests - 1) * 4096)
      << "each value is whole: " << requests << " requests, " << bytes << " bytes";
}

}  // namespace
}  // namespace kvrelay
