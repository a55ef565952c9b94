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
  kSessionsEnded,
  kSessionsDied,
  kSessionWithdrawals,
  kSharedStateRepairs,
  kLiveRequests,
  kRememberedIds,
  kCoordinatorCounterCount,
};

enum CoordinatorHistogram : uint32_t {
  kRequestLatencyNs,  // first half submitted -> completion written
};

inline constexpr const char* kCoordinatorCounterLabels[] = {
    "requests_submitted",   "requests_finished",    "requests_failed",      "requests_cancelled",
    "requests_timed_out",   "submissions_rejected", "late_halves_absorbed", "stray_reports",
    "malformed_records",    "completions_delayed",  "tasks_delayed",        "worker_restarts",
    "workers_lost",         "sessions_ended",       "sessions_died",        "session_withdrawals",
    "shared_state_repairs", "live_requests",        "remembered_ids",
};
static_assert(sizeof(kCoordinatorCounterLabels) / sizeof(kCoordinatorCounterLabels[0]) ==
              kCoordinatorCounterCount);

}  // namespace kvrelay::coordinator
