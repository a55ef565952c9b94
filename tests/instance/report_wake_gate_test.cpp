// The gates that let only a request's last finished report wake the
// coordinator: exactly one rank is told it is last, whatever the
// interleaving; a gate that knows another request, or none, always says
// "wake".
#include "instance/report_wake_gate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace kvrelay {
namespace {

TEST(ReportWakeGate, OfRanksReportingOneAfterAnotherOnlyTheLastWakes) {
  auto gates = std::make_unique<ReportWakeGates>();
  report_wake_gate::arm(*gates, 41, 4);
  EXPECT_FALSE(report_wake_gate::last_to_report(*gates, 41));
  EXPECT_FALSE(report_wake_gate::last_to_report(*gates, 41));
  EXPECT_FALSE(report_wake_gate::last_to_report(*gates, 41));
  EXPECT_TRUE(report_wake_gate::last_to_report(*gates, 41));
  EXPECT_TRUE(report_wake_gate::last_to_report(*gates, 41))
      << "a rank reporting twice only wakes early, never holds a wake back";
}

TEST(ReportWakeGate, AGateThatKnowsAnotherRequestOrNoneWakes) {
  auto gates = std::make_unique<ReportWakeGates>();
  EXPECT_TRUE(report_wake_gate::last_to_report(*gates, 5)) << "never armed";
  report_wake_gate::arm(*gates, 5, 2);
  report_wake_gate::arm(*gates, 5 + kReportWakeGates, 2);  // the same gate, a newer request
  EXPECT_TRUE(report_wake_gate::last_to_report(*gates, 5)) << "the gate moved on";
  EXPECT_FALSE(report_wake_gate::last_to_report(*gates, 5 + kReportWakeGates));
  report_wake_gate::arm(*gates, 6, 1);
  EXPECT_TRUE(report_wake_gate::last_to_report(*gates, 6)) << "tp 1: every report wakes";
  report_wake_gate::arm(*gates, 7, 0x20000);
  EXPECT_TRUE(report_wake_gate::last_to_report(*gates, 7)) << "more ranks than a gate counts";
}

TEST(ReportWakeGate, RanksRacingThroughAGateLeaveExactlyOneLast) {
  constexpr uint32_t kRanks = 4;
  constexpr uint64_t kRequests = 20000;
  auto gates = std::make_unique<ReportWakeGates>();
  std::vector<std::atomic<uint32_t>> lasts(kRequests);
  // The coordinator arms a window of requests ahead of the ranks, as it
  // dispatches before they report; gates are reused every kReportWakeGates.
  for (uint64_t base = 0; base < kRequests; base += kReportWakeGates) {
    const uint64_t end = std::min<uint64_t>(base + kReportWakeGates, kRequests);
    for (uint64_t h = base; h < end; ++h)
      report_wake_gate::arm(*gates, h + 1, kRanks);
    std::vector<std::thread> ranks;
    for (uint32_t rank = 0; rank < kRanks; ++rank) {
      ranks.emplace_back([&, rank] {
        for (uint64_t h = base; h < end; ++h) {
          // Each rank walks the window in its own order.
          const uint64_t i = rank % 2 == 0 ? h : end - 1 - (h - base);
          if (report_wake_gate::last_to_report(*gates, i + 1)) lasts[i].fetch_add(1);
        }
      });
    }
    for (std::thread& t : ranks)
      t.join();
  }
  for (uint64_t h = 0; h < kRequests; ++h)
    ASSERT_EQ(lasts[h].load(), 1u) << "request " << h + 1 << ": exactly one rank wakes";
}

}  // namespace
}  // namespace kvrelay
