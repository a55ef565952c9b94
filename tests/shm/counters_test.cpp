// Counters: labels, values and histograms, read by another process while the
// owner keeps writing.
#include "shm/counters.h"

#include <gtest/gtest.h>
#include <signal.h>

#include "support/processes.h"

namespace kvrelay {
namespace {

using testing::SharedRegion;
using namespace std::chrono_literals;

TEST(Histogram, BucketsArePowersOfTwo) {
  EXPECT_EQ(histogram_bucket(0), 0u);
  EXPECT_EQ(histogram_bucket(1), 1u);
  EXPECT_EQ(histogram_bucket(2), 2u);
  EXPECT_EQ(histogram_bucket(3), 2u);
  EXPECT_EQ(histogram_bucket(1024), 11u);
  EXPECT_EQ(bucket_upper_bound(11), 2047u);
}

TEST(Histogram, QuantilesNeverUnderestimateAndStayWithinAFactorOfTwo) {
  SharedRegion mem(sizeof(CountersBlock));
  auto* block = new (mem.data()) CountersBlock{};
  define_counters(*block, {}, {{"latency", "ns"}});
  CounterWriter w(*block);
  for (uint64_t v = 1; v <= 1000; ++v)
    w.record(0, v * 1000);  // 1 us .. 1 ms
  const HistogramSnapshot h = snapshot_counters(*block).histograms.at(0);
  EXPECT_EQ(h.label, "latency");
  EXPECT_EQ(h.unit, "ns");
  EXPECT_EQ(h.count, 1000u);
  EXPECT_EQ(h.max, 1'000'000u);
  const uint64_t p50 = h.quantile(0.5);
  EXPECT_GE(p50, 500'000u);
  EXPECT_LT(p50, 1'000'000u + 1);
  EXPECT_EQ(h.quantile(1.0), 1'000'000u) << "capped by the true maximum";
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
