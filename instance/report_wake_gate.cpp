#include "instance/report_wake_gate.h"

namespace kvrelay::report_wake_gate {

namespace {

constexpr uint64_t kTagMask = (uint64_t{1} << 48) - 1;
constexpr uint64_t kCountMask = 0xffff;

std::atomic<uint64_t>& gate_of(ReportWakeGates& gates, uint64_t handle) {
  return gates.words[handle % kReportWakeGates];
}

}  // namespace

void arm(ReportWakeGates& gates, uint64_t handle, uint32_t ranks) {
  // One rank, or more than a gate counts: every report wakes.
  const uint64_t count = ranks > kCountMask ? 1 : ranks;
  // Release: nothing of the request's dispatch is ordered by the gate, but a
  // rank that reads it must see the arming, not an older request's count.
  gate_of(gates, handle).store(((handle & kTagMask) << 16) | count, std::memory_order_release);
}

bool last_to_report(ReportWakeGates& gates, uint64_t handle) {
  std::atomic<uint64_t>& gate = gate_of(gates, handle);
  uint64_t word = gate.load(std::memory_order_acquire);
  for (;;) {
    if ((word >> 16) != (handle & kTagMask) || (word & kCountMask) <= 1) return true;
    // acq_rel: this rank's report (pushed before) is visible to whichever
    // rank reads the count it leaves, and so to the coordinator that rank wakes.
    if (gate.compare_exchange_weak(word, word - 1, std::memory_order_acq_rel,
                                   std::memory_order_acquire))
      return false;
  }
}

}  // namespace kvrelay::report_wake_gate
