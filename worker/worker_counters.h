// The labels of a worker's counters block, in id order (kvrelay-dump reads
// the labels from the block itself).
#pragma once

#include <cstdint>
#include <utility>

namespace kvrelay::worker {

enum WorkerCounter : uint32_t {
  kTasks,
  kSignals,
  kBadSignals,
  kLayerCopies,
  kBytesCopied,
  kRequestsFinished,
  kRequestsFailed,
  kRequestsCancelled,
  kReportsDelayed,  // reports that waited because the report ring was full
  kStaleSessions,   // pending signals dropped as stale (before a task's watermark, dead engine)
  kSignalRepairs,   // signal-ring state another process overwrote, or a dead producer's claims
  // Sending over the network (tcp lanes, rdma sessions, over all peers):
  kTcpLanesOpened,
  kTcpLanesLost,        // lanes that had served, closed (the peer died, reset or went silent)
  kTcpConnectFailures,  // attempts that reached no one (each starts a backoff)
  kRdmaSessionsOpened,
  kRdmaSessionsLost,
  kRdmaConnectFailures,
  // Receiving (a decode rank's tcp listener and rdma control listener):
  kNetConnectionsAccepted,
  kNetConnectionsRefused,  // failed authentication or handshake
  kTcpFramesReceived,
  kTcpBytesReceived,
  kTcpFramesRefused,  // nacked: outside the pool, not expected, or not landed
  kRdmaSessionsAccepted,
  kRdmaTransfersReceived,  // landed and acked
  kRdmaIntentsRefused,
  // The watchdog (stall_watch.h): requests found not finished long after
  // their final chunk was signalled on this rank.
  kStalledRequests,
  // Finished reports pushed without waking the coordinator: another rank's
  // report of the same request was still to come (report_wake_gate.h).
  kReportsWithoutWake,
  kWorkerCounterCount,
};

enum WorkerHistogram : uint32_t {
  kSignalToCopyDoneNs,  // a layer signal's arrival to that layer's copy being done
  kLayerCopyNs,         // one layer's copy for one request (the memcpys alone)
  kLayerCopyBytes,
  kLayerCopyMBps,
  // Hops of the dispatch and completion paths (docs/latency.md):
  kTaskWrittenToReadNs,    // coordinator wrote a task -> this worker read it
  kDestReadToCopyNs,       // a CacheDest read -> its first copy began (layers already computed)
  kCopyDoneToReportNs,     // a request's last copy seen done -> its report written
  kSignalWrittenToReadNs,  // the engine pushed a layer signal -> this worker read it
  // The tail: the engine pushed the signal that let a request's last layer
  // go -> this rank's finished report written (wake-up, copy and report).
  kLastSignalToReportNs,
  // The decode side over ipc: a prefill worker's landed record (its copies
  // into this rank's pool done) -> this rank read it; and a request's tail,
  // the last landed record that counted -> this rank's arrived report.
  kLandedToReadNs,
  kLastLandedToReportNs,
  kWorkerHistogramCount,
};

inline constexpr std::pair<const char*, const char*> kWorkerHistogramLabels[] = {
    // One histogram a line.
    // clang-format off
    {"signal_to_copy_done", "ns"},
    {"layer_copy_time", "ns"},
    {"layer_copy_bytes", "bytes"},
    {"layer_copy_rate", "MB/s"},
    {"hop_task_written_to_read", "ns"},
    {"hop_dest_read_to_copy", "ns"},
    {"hop_copy_done_to_report", "ns"},
    {"hop_signal_written_to_read", "ns"},
    {"tail_last_signal_to_report", "ns"},
    {"hop_landed_to_read", "ns"},
    {"tail_last_landed_to_report", "ns"},
    // clang-format on
};
static_assert(sizeof(kWorkerHistogramLabels) / sizeof(kWorkerHistogramLabels[0]) ==
              kWorkerHistogramCount);

inline constexpr const char* kWorkerCounterLabels[] = {
    "tasks",
    "signals",
    "bad_signals",
    "layer_copies",
    "bytes_copied",
    "requests_finished",
    "requests_failed",
    "requests_cancelled",
    "reports_delayed",
    "stale_signal_sessions",
    "signal_ring_repairs",
    "tcp_lanes_opened",
    "tcp_lanes_lost",
    "tcp_connect_failures",
    "rdma_sessions_opened",
    "rdma_sessions_lost",
    "rdma_connect_failures",
    "net_connections_accepted",
    "net_connections_refused",
    "tcp_frames_received",
    "tcp_bytes_received",
    "tcp_frames_refused",
    "rdma_sessions_accepted",
    "rdma_transfers_received",
    "rdma_intents_refused",
    "stalled_requests",
    "reports_without_wake",
};
static_assert(sizeof(kWorkerCounterLabels) / sizeof(kWorkerCounterLabels[0]) ==
              kWorkerCounterCount);

// What each counter counts, for an operator (kvrelay-dump --prometheus's
// HELP lines), in the same order.
inline constexpr const char* kWorkerCounterHelp[] = {
    "Cache and swap tasks this rank read from its task ring",
    "Layer signals (batches and layer-done records) this rank read from its signal ring",
    "Layer signals refused: a layer beyond the instance's, a step other than its batch's, or an unknown record",
    "Layer copies done (one per request, layer and destination)",
    "Bytes this rank copied or sent for prefill-to-decode requests (every transport)",
    "Requests this rank finished its part of",
    "Requests this rank failed (its report names why)",
    "Requests this rank stopped because they were cancelled or withdrawn",
    "Reports that waited because the report ring to the coordinator was full",
    "Pending signals dropped as stale: before a task's watermark, or of an engine that died",
    "Signal-ring state another process overwrote, or a dead producer's claims, repaired",
    "tcp lanes this rank opened to decode peers",
    "tcp lanes that had served and closed: the peer died, reset or went silent",
    "tcp connection attempts that reached no one (each starts a backoff)",
    "rdma sessions this rank opened to decode peers",
    "rdma sessions that had served and were lost",
    "rdma session attempts that failed (each starts a backoff)",
    "Connections this rank's listeners accepted (authenticated and handshaken)",
    "Connections this rank's listeners refused: failed authentication or handshake",
    "tcp frames received, landed in the pool and acked",
    "Payload bytes received over tcp and landed in the pool",
    "tcp frames refused (nacked): outside the pool, not expected, or not landed",
    "rdma sessions this rank's listener accepted",
    "rdma transfers that landed here and were acked",
    "rdma transfer intents refused: outside the pool, not expected, or over the granted bytes",
    "Requests found unfinished long after their final chunk was signalled (the stall watchdog)",
    "Finished reports sent without waking the coordinator: another rank's report of the request was still to come",
};
static_assert(sizeof(kWorkerCounterHelp) / sizeof(kWorkerCounterHelp[0]) == kWorkerCounterCount);

inline constexpr const char* kWorkerHistogramHelp[] = {
    "A layer signal's arrival at this rank to that layer's copy being done",
    "One layer's copy for one request: the copies alone",
    "Bytes of one layer's copy for one request",
    "Rate of one layer's copy for one request",
    "Dispatch hop: the coordinator wrote a task to this rank's ring -> this rank read it",
    "Dispatch hop: a CacheDest read -> its first copy began (layers already computed)",
    "Completion hop: a request's last copy seen done -> its report written",
    "Completion hop: the engine pushed a layer signal -> this rank read it (the worker's wake-up)",
    "Completion tail: the engine pushed the signal that let a request's last layer go -> this "
    "rank's finished report written",
    "Decode hop (ipc): a prefill worker's copies into this rank's pool landed -> this rank read "
    "its record of them",
    "Decode tail (ipc): the last landed write that counted for an expected request -> this "
    "rank's arrived report written",
};
static_assert(sizeof(kWorkerHistogramHelp) / sizeof(kWorkerHistogramHelp[0]) ==
              kWorkerHistogramCount);

}  // namespace kvrelay::worker
