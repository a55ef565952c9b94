// The labels of the coordinator's counters block, in id order.
#pragma once

#include <cstdint>

namespace kvrelay::coordinator {

enum CoordinatorCounter : uint32_t {
  kSubmitted,
  kFinished,
  kErrors,
  kCancelled,
  kTimeouts,
  kRejected,
  kAbsorbed,
  kStrayReports,
  kMalformedRecords,
  kCompletionsDelayed,
  kTasksDelayed,
  kWorkerRestarts,
  kWorkersLost,
  kCoordinatorCounterCount,
};

enum CoordinatorHistogram : uint32_t {
  kRequestLatencyNs,  // first half submitted -> completion written
};

inline constexpr const char* kCoordinatorCounterLabels[] = {
    "requests_submitted", "requests_finished",    "requests_failed",      "requests_cancelled",
    "requests_timed_out", "submissions_rejected", "late_halves_absorbed", "stray_reports",
    "malformed_records",  "completions_delayed",  "tasks_delayed",        "worker_restarts",
    "workers_lost",
};

}  // namespace kvrelay::coordinator
