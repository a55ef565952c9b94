// Which rank's "finished" report wakes the coordinator.
//
// At tp > 1 every rank reports each request finished, and the table can do
// nothing with a request until the last of them has. Waking the coordinator
// for each report costs a futex wake and a reschedule per rank, on the very
// cores that the remaining ranks' copies need. So the coordinator arms a
// gate with the number of ranks it dispatched to, and each rank, after
// pushing its report, counts itself through the gate: of the finished
// reports, only the last one rings the coordinator's doorbell. The others
// wait in their rings, drained with the last one.
//
// The gate is a hint, never a source of truth:
//   - every final report (finished, failed, cancelled) counts itself, but
//     only a finished one may skip the wake: a failure, a cancellation or a
//     withdrawal's confirmation always wakes the coordinator. (Counting them
//     too means that the last rank to answer a withdrawal after another
//     rank's failure wakes it, even when its answer is "finished".)
//   - a report goes into its ring before its rank counts itself, so the rank
//     that sees itself last wakes a coordinator that finds every report;
//   - a gate holds one request at a time, named by its handle's low 48 bits:
//     a gate that names another request (two live requests on one gate, or
//     none armed) wakes, and so does a count already at one (a rank that
//     reports twice only wakes early);
//   - a rank that dies between its report and its count leaves the count too
//     high: the coordinator is woken by the death itself (its supervision),
//     and it drains every report ring on each loop turn, parking at most
//     50 ms, so a report the gate held back is read late, never lost.
#pragma once

#include <atomic>
#include <cstdint>

namespace kvrelay {

inline constexpr uint32_t kReportWakeGates = 4096;

struct ReportWakeGates {
  // (the handle's low 48 bits) << 16 | ranks whose final report is still to
  // come; 0: never armed.
  std::atomic<uint64_t> words[kReportWakeGates];
};

namespace report_wake_gate {

// Coordinator: `handle` is about to be dispatched to `ranks` ranks, each of
// which will report it once. Call before the first task is written.
void arm(ReportWakeGates& gates, uint64_t handle, uint32_t ranks);

// Worker: a final report for `handle` was just pushed; counts it, and says
// whether it was the last one the gate waited for (true too when the gate
// does not know the request, so that the caller wakes the coordinator).
bool last_to_report(ReportWakeGates& gates, uint64_t handle);

}  // namespace report_wake_gate
}  // namespace kvrelay
