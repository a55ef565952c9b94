// The labels of the coordinator's counters block, in id order.
#pragma once

#include <cstdint>
#include <utility>

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
  // Hops of the dispatch and completion paths (docs/latency.md):
  kSubmitToReadNs,            // the engine submitted a CacheTask/CacheDest -> read here
  kReadToTaskWrittenNs,       // read -> its WorkerTask written to every rank's ring
  kReportWrittenToReadNs,     // a worker wrote a report -> read here
  kReportReadToCompletionNs,  // the final report read -> the completion written
  kCoordinatorHistogramCount,
};

inline constexpr std::pair<const char*, const char*> kCoordinatorHistogramLabels[] = {
    {"request_latency", "ns"},
    {"hop_submit_to_read", "ns"},
    {"hop_read_to_task_written", "ns"},
    {"hop_report_written_to_read", "ns"},
    {"hop_report_read_to_completion", "ns"},
};
static_assert(sizeof(kCoordinatorHistogramLabels) / sizeof(kCoordinatorHistogramLabels[0]) ==
              kCoordinatorHistogramCount);


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
