// The layer-wise send logic of one worker (DESIGN.md section 5): follows the
// engine's layer signals per slot, binds requests to slots, and moves each
// layer of each request's blocks as soon as that layer is computed.
//
// The model, per request:
//   computed(l) = blocks of layer l whose KV the engine has written:
//                 all of them once the request's prefilled tokens reach
//                 need_prefill_tokens, else prefilled_tokens / block_size
//   sent(l)     = blocks of layer l already copied (starts at the prefix the
//                 decode side holds: len(src) - len(dest))
//   on every signal, and when the decode half arrives (late or not), hand
//   layer l's blocks [sent(l), computed(l)) to the transport and advance
//   sent(l).
//   The request is finished when the prefill is complete, sent(l) reaches
//   len(src) for every layer, and the transport has reported every one of
//   its transfers applied at the destination; the rank then reports.
//
// Transfers are asynchronous (worker/transport.h): each (request, layer)
// transfer in flight is counted, and a request never reports while one is in
// flight. A transfer that fails fails its request only, naming the rank, the
// layer and the peer; a request that ends early (failure, cancel) with
// transfers in flight reports when the last of them has completed, so that
// nothing writes its destination blocks after its report.
//
// Signals name a slot and, normally, a request tag (records::request_tag of
// the request id). Signals for a (slot, tag) that no bound request claims yet
// are kept as a pending session and adopted when that request is bound, so
// signals may arrive before the CacheTask even if the slot is reused in the
// meantime. Without tags (tag 0, the original's protocol) a chunk at offset 0
// is taken to start a new request, and a request adopts only untagged
// signals pushed after its CacheTask was submitted (the task carries each
// rank's signal-ring position at submission, its watermark): the signals of
// a request that ended before the engine learned it did are never taken for
// the next request on that slot. When a batch entry shows a slot serving
// another request while a request bound to it has not finished its prefill,
// that request fails (the engine moved on; it would never finish).
//
// Each batch record that follows layer records starts a new batch, whatever
// its step number: a step number used again cannot merge two batches.
//
// Entries without a tag reach a worker only where no kvrelay client could
// stamp them (client.cpp stamps an untagged entry with the request its slot
// was last given): a slot that never had a CacheTask. If the final chunk of
// such a request was signalled before its CacheTask arrived and taken into
// another untagged session of the slot (one whose signals began before the
// task's watermark), nothing could tell the two apart: the request fails at
// once, naming the slot and the step, instead of waiting for its deadline.
//
// Watchdog: find_stalls() lists the requests that have not reported long
// after their final chunk was signalled on this rank (or after they ended
// with transfers still in flight), with what each waits for.
//
// When an engine session dies, the pending sessions its signals created are
// dropped (on_session_ended): a restarted engine that reuses request ids
// never inherits them. Legacy per-query requests follow the (step, layer)
// signal instead of a slot: layers of steps before the current one are
// complete, layers up to the signalled layer of the current step are complete.
//
// Single-threaded: the worker's loop owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "instance/pool_geometry.h"
#include "instance/request_stalls.h"
#include "schemas/kvrelay.capnp.h"
#include "schemas/records.h"
#include "worker/transport.h"
#include "worker/worker_counters.h"

namespace kvrelay::worker {

inline constexpr uint32_t kMaxSlots = 512;

struct SchedulerCounters {
  uint64_t signals = 0;
  uint64_t bad_signals = 0;       // out-of-range slot, layer for an unknown step, ...
  uint64_t dropped_sessions = 0;  // pending sessions dropped at the kMaxPendingSessions bound
  uint64_t stale_sessions = 0;    // pending sessions dropped as stale (watermark, dead engine)
  uint64_t layer_copies = 0;      // (request, layer) copies done
  uint64_t bytes = 0;
  uint64_t finished = 0;
  uint64_t failed = 0;
  uint64_t cancelled = 0;
};

class SendScheduler {
 public:
  // report(handle, kind, bytes, message, first_copy_ns): the request's end
  // on this rank; first_copy_ns is when its first copy began (0: none).
  using Reporter =
      std::function<void(uint64_t, records::ReportKind, uint64_t, const std::string&, uint64_t)>;
  // Called for each layer copy: signal-to-copy-done latency, the copy's own
  // duration (both ns), and its bytes.
  using LatencyObserver = std::function<void(uint32_t layer, uint64_t signal_to_done_ns,
                                             uint64_t copy_ns, uint64_t bytes)>;
  // Called for each hop of the dispatch and completion paths it sees
  // (kDestReadToCopyNs, kCopyDoneToReportNs), in ns.
  using HopObserver = std::function<void(WorkerHistogram hop, uint64_t ns)>;

  SendScheduler(uint32_t rank, const PoolGeometry& local, Transport& transport, Reporter reporter);
  ~SendScheduler();
  SendScheduler(const SendScheduler&) = delete;
  SendScheduler& operator=(const SendScheduler&) = delete;

  // `watermark`: this rank's signal-ring position when the task was
  // submitted (nullopt: unknown; any untagged signal may then be adopted).
  void on_bind(uint64_t handle, schema::CacheTask::Reader task,
               std::optional<uint64_t> watermark = std::nullopt);
  // `read_ns`: when the task was read (0: untimed).
  void on_dest(uint64_t handle, schema::CacheDest::Reader dest, uint64_t read_ns = 0);
  void on_cancel(uint64_t handle);
  // `index`: the signal's position in this rank's signal ring.
  void on_signal(const records::LayerSignal& signal, uint64_t index = 0);
  // Engine session `session` died: forget the pending signals it pushed.
  void on_session_ended(uint32_t session);
  // Takes the transport's completions: finishes or fails the requests whose
  // transfers they end. The worker calls it when the transport has some.
  void poll_transfers();

  // A request that has not reported for at least `after_ns` since its final
  // chunk was signalled here (or since it ended with transfers in flight).
  struct Stall {
    const std::string* id;
    uint32_t slot;
    StallReason reason;
    uint64_t since_ns;        // CLOCK_MONOTONIC
    uint32_t in_flight;       // transfers
    const std::string* peer;  // nullptr without a destination
    bool first_time;          // not listed by an earlier call
  };
  // Fills `out` (cleared first) with the stalled requests, oldest first. The
  // pointers live until the next call that changes the scheduler.
  void find_stalls(uint64_t now_ns, uint64_t after_ns, std::vector<Stall>& out);
  void set_latency_observer(LatencyObserver o) { latency_ = std::move(o); }
  void set_hop_observer(HopObserver o) { hop_ = std::move(o); }

  size_t live_requests() const { return requests_.size(); }
  // (request, layer) transfers handed to the transport and not completed.
  size_t transfers_in_flight() const { return transfers_in_flight_; }
  const SchedulerCounters& counters() const { return counters_; }

 private:
  struct Progress {
    std::vector<uint64_t> tokens;  // per layer: tokens computed
  };
  struct Request;
  // Signals for a request that is not bound yet.
  struct Session {
    uint32_t tag = 0;
    uint32_t pusher = 0;       // the engine session that pushed its signals
    uint64_t seq = 0;          // creation order, to find the oldest
    uint64_t first_index = 0;  // signal-ring position of its first and last signals
    uint64_t last_index = 0;
    Progress progress;
  };
  // The newest untagged chunk of a slot whose every layer was signalled
  // while no bound request owned it (it went to a pending session).
  struct UnownedChunk {
    bool seen = false;
    uint64_t index = 0;  // its batch entry's signal-ring position
    uint64_t step = 0;
    uint64_t tokens = 0;  // prefilled tokens after it
  };
  struct Slot {
    std::vector<uint64_t> bound;  // handles of requests bound to this slot, oldest first
    std::deque<Session> pending;  // oldest first
    UnownedChunk unowned_final;
  };
  // Binds can lag far behind signals (they pass through the coordinator), so
  // many sessions may wait; past this many in all, the oldest is dropped
  // (its request, if it ever binds, fails to see its early signals and times
  // out): the memory bound for an engine that signals requests it never submits.
  static constexpr size_t kMaxPendingSessions = 8192;

  void on_batch_entry(const records::BatchEntry& e, uint32_t pusher, uint64_t index);
  Progress* progress_for(uint32_t slot, uint32_t tag, Request** owner);
  Session& pending_session(Slot& slot, uint32_t tag, uint32_t offset, uint64_t index);
  void adopt_pending(Request& req, Slot& slot, std::optional<uint64_t> watermark);
  // Its final chunk went to another session of its slot (see the top).
  bool lost_final_chunk(const Request& req, const Slot& slot,
                        std::optional<uint64_t> watermark) const;
  void note_prefill_progress(Request& r, uint64_t now_ns);
  // Submits every layer the request may send now; may end (destroy) `r`.
  void advance(Request& r, uint64_t signal_ns);
  void on_transfer_done(const TransferCompletion& c);
  void finish_if_done(Request& r);
  bool prefill_complete(const Request& r) const;
  uint32_t computed_blocks(const Request& r, uint32_t layer) const;
  void end(Request& r, records::ReportKind kind, const std::string& message);
  void handle_signal(const records::LayerSignal& signal, uint64_t index);
  void unbind(Request& r);
  void release_slot_if_done(Request& r);

  uint32_t rank_;
  PoolGeometry local_;
  uint32_t layers_;
  Transport& transport_;
  Reporter report_;
  LatencyObserver latency_;
  HopObserver hop_;
  // While a layer signal is handled: when the engine pushed it (its stamp,
  // 0 if it has none). What advance() submits is timed from it.
  uint64_t signal_pushed_ns_ = 0;
  std::vector<BlockRun> runs_;  // advance()'s plan of one layer, reused
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;
  std::vector<Slot> slots_;
  size_t pending_sessions_ = 0;
  uint64_t session_seq_ = 0;
  std::vector<uint64_t> legacy_requests_;  // handles
  // A legacy signal walks a copy of legacy_requests_ (advancing a request may
  // end it and erase its handle), kept here so the walk allocates nothing.
  std::vector<uint64_t> legacy_walk_;
  // The current step's batch: (slot, tag, prefilled tokens after this chunk).
  struct BatchItem {
    uint32_t slot;
    uint32_t tag;
    uint64_t tokens_after;
    uint64_t index;  // the batch record's signal-ring position
  };
  uint64_t batch_step_ = UINT64_MAX;
  bool batch_open_ = false;  // the last record was a batch record (the next one may continue it)
  std::vector<BatchItem> batch_;
  std::vector<uint64_t> touched_;   // reused per layer record: no allocation on the hot path
  std::vector<uint64_t> moved_on_;  // reused per batch entry
  std::vector<TransferCompletion> completions_;  // reused per poll
  uint64_t request_serial_ = 0;
  size_t transfers_in_flight_ = 0;
  // Legacy mode: newest (step, layer) signalled; valid once legacy_seen_.
  bool legacy_seen_ = false;
  uint64_t legacy_step_ = 0;
  uint32_t legacy_layer_ = 0;
  SchedulerCounters counters_;
};

}  // namespace kvrelay::worker
