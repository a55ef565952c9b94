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
  // The tail: the report that finished a request, written -> read here (the
  // coordinator's wake-up on the completion path).
  kLastReportWrittenToReadNs,
  kCoordinatorHistogramCount,
};

inline constexpr std::pair<const char*, const char*> kCoordinatorHistogramLabels[] = {
    {"request_latency", "ns"},
    {"hop_submit_to_read", "ns"},
    {"hop_read_to_task_written", "ns"},
    {"hop_report_written_to_read", "ns"},
    {"hop_report_read_to_completion", "ns"},
    {"tail_last_report_written_to_read", "ns"},
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

// What each counter counts, for an operator (kvrelay-dump --prometheus's
// HELP lines), in the same order.
inline constexpr const char* kCoordinatorCounterHelp[] = {
    "Requests submitted (a request counts once, at its first half)",
    "Requests that ended finished",
    "Requests that ended in an error (the completion names the rank and why)",
    "Requests that ended cancelled",
    "Requests that ended timed out (their deadline passed)",
    "Submissions refused with a 'rejected' completion (a duplicate half, a bad record, ...)",
    "Halves whose request had already ended (e.g. a decode half after a cancel), absorbed without a second completion",
    "Worker reports for no live request, dropped",
    "Records in the submit ring that could not be decoded, each answered and logged",
    "Completions that waited because the engine's completion ring was full",
    "Tasks that waited because a rank's task ring was full",
    "Workers restarted by the coordinator",
    "Workers found dead (each fails the requests it was part of)",
    "Engine sessions that ended by closing their client",
    "Engine sessions whose process died (their requests withdrawn)",
    "Requests withdrawn because the engine session that submitted them ended",
    "Shared state another process overwrote (header, slots, ring indices), repaired",
    "Requests in flight now",
    "Ended request ids remembered so that a late half is absorbed, not started again",
};
static_assert(sizeof(kCoordinatorCounterHelp) / sizeof(kCoordinatorCounterHelp[0]) ==
              kCoordinatorCounterCount);

inline constexpr const char* kCoordinatorHistogramHelp[] = {
    "A request's first half submitted to its completion written",
    "Dispatch hop: the engine submitted a CacheTask or CacheDest -> the coordinator read it",
    "Dispatch hop: read -> its task written to every rank's ring",
    "Completion hop: a worker wrote a report -> the coordinator read it",
    "Completion hop: the final report read -> the completion written",
    "Completion tail: the report that finished a request, written -> the coordinator read it",
};
static_assert(sizeof(kCoordinatorHistogramHelp) / sizeof(kCoordinatorHistogramHelp[0]) ==
              kCoordinatorHistogramCount);

}  // namespace kvrelay::coordinator
