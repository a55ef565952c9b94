// The coordinator's task table: every request's life from its first
// submitted half to its one Completion (DESIGN.md section 5, last part).
//
//   - CacheTask and CacheDest are merged by request id, in either order. The
//     prefill half is bound on every rank as soon as it is valid (so workers
//     can follow the slot's signals); the decode half is dispatched once the
//     pair is valid, and the ranks start sending.
//   - SwapTask, ConnectTask and RegisterPool are single-part requests.
//   - Every rank reports; the table turns the reports into exactly one
//     Completion per request: finished (every rank finished), error (the
//     first failing rank, named), cancelled, or timeout. A request that fails
//     validation also gets exactly one completion (error, errorRank -1).
//   - A submission refused without touching any live request (a duplicate
//     half, a Cancel for an id that is not live) is answered with a
//     `rejected` completion; it never ends the live request of that id.
//   - A request that ends other than finished (error, cancel, timeout, a
//     lost rank) is withdrawn from every rank that may still write into its
//     destination blocks, and its completion waits until each of them has
//     confirmed (or is confirmed dead): only then may the engine reuse those
//     blocks, which the completion says (blocksReusable). A rank that does
//     not confirm within `withdraw_timeout_ns` is reported through
//     Sink::rank_unresponsive: a supervised worker is killed, and the
//     completion waits for its exit to be confirmed; an external one cannot
//     be, and the completion goes out with blocksReusable false.
//   - While a rank is down (its worker died and has not been restarted yet),
//     a new request that needs it fails at once, naming the rank: nothing is
//     queued for a worker that does not exist, so nothing stale can run
//     after the engine was told the request ended.
//   - Every request belongs to the engine session that submitted it. When a
//     session dies (its process is gone), its requests are withdrawn at once,
//     confirmed as on cancel, without completions (nobody is left to read
//     them), and their ids are free for the next engine to use.
//   - After its completion an id is remembered for a while (Tombstones): the
//     partner half of a request that already ended is absorbed silently, so
//     the engine never sees a second final completion for one request.
//   - Texts echoed into completions are capped, so that every completion fits
//     one record of the completion ring.
//
// The table does no I/O. It talks to the world through a Sink (rings in the
// coordinator, a recorder in tests), and is driven by on_*() calls and tick().
// Not thread-safe: the coordinator's single loop owns it.
#pragma once

#include <capnp/message.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "coordinator/coordinator_counters.h"
#include "coordinator/reuse.h"
#include "coordinator/tombstones.h"
#include "instance/instance_config.h"
#include "schemas/kvrelay.capnp.h"
#include "schemas/records.h"
#include "schemas/validate.h"
#include "shm/clock.h"
#include "shm/string_key.h"

namespace kvrelay::coordinator {

using CompletionStatus = schema::Completion::Status;
using CompletionKind = schema::Completion::Kind;

// The longest message a completion carries, and the longest text it echoes
// from a submission (a CacheDest's error_message).
inline constexpr size_t kMaxCompletionMessageBytes = 1024;
inline constexpr size_t kMaxEchoedTextBytes = 512;

// What the coordinator knows of a peer instance named by a CacheDest (ipc).
struct PeerInfo {
  uint32_t num_blocks = 0;
  uint32_t tp_size = 0;
  Role role = Role::kMixed;
};

// What the table asks the world to do.
class Sink {
 public:
  virtual ~Sink() = default;
  // Deliver a WorkerTask to `rank` (the table already filled it in).
  virtual void to_worker(uint32_t rank, capnp::MessageBuilder& task) = 0;
  // Deliver a completion to the engine.
  virtual void complete(capnp::MessageBuilder& completion) = 0;
  // `handle` is about to go to `ranks` ranks, each of which will report it:
  // only the last finished report needs to wake the coordinator
  // (instance/report_wake_gate.h). A hint; nothing depends on it.
  virtual void expect_reports(uint64_t /*handle*/, uint32_t /*ranks*/) {}
  // A rank did not confirm a withdrawal in time and should be stopped.
  // Returns true when it will be (its death is then reported through
  // on_rank_lost), false when it cannot be (an external worker).
  virtual bool rank_unresponsive(uint32_t /*rank*/, const std::string& /*why*/) { return false; }
  // A swap load is about to be dispatched: take a per-layer progress slot
  // (kNoProgressSlot when there is none) and its generation; given back with
  // end_load_progress.
  virtual uint32_t begin_load_progress(uint64_t /*handle*/, const std::string& /*id*/,
                                       uint32_t /*first_layer*/, uint32_t /*layer_count*/,
                                       uint32_t& /*generation*/) {
    return kNoProgressSlot;
  }
  virtual void end_load_progress(uint32_t /*slot*/, bool /*finished*/) {}
  // A hop of the dispatch path took `ns` (coordinator_counters.h).
  virtual void observe_hop(CoordinatorHistogram /*hop*/, uint64_t /*ns*/) {}
  static constexpr uint32_t kNoProgressSlot = 0xffffffff;
};

struct TableOptions {
  // A request's deadline when it names none.
  Nanos default_deadline = std::chrono::seconds(60);
  // How long after a request ends its id is remembered, beyond the longest
  // deadline its partner half could still come within.
  Nanos tombstone_margin = std::chrono::seconds(30);
  // Ids remembered at most (Tombstones); past it, new requests are refused.
  size_t max_tombstones = size_t{1} << 21;
  // Requests in flight at most; past it, new requests are refused.
  size_t max_live_requests = size_t{1} << 16;
  // How long a rank may take to confirm that it stopped working on a request.
  Nanos withdraw_timeout = std::chrono::seconds(1);
  // This instance's name: never a valid transfer destination.
  std::string own_instance;
  // This instance's TP size: a peer of another size (heterogeneous TP)
  // takes each rank's heads on the ranks the head split names, not on
  // device_ids (0: unknown, device_ids always checked).
  uint32_t own_tp_size = 0;
  // Optional: what is known of a peer (decode) instance for ipc
  // destinations, by name (looked up by the coordinator; nullopt: unknown).
  std::function<std::optional<PeerInfo>(std::string_view peer_instance)> peer_info;
};

struct TableCounters {
  uint64_t submitted = 0;
  uint64_t finished = 0;
  uint64_t errors = 0;
  uint64_t cancelled = 0;
  uint64_t timeouts = 0;
  uint64_t rejected = 0;
  uint64_t absorbed = 0;             // partner halves of already-ended requests
  uint64_t stray_reports = 0;        // reports for handles no longer live
  uint64_t session_withdrawals = 0;  // requests withdrawn because their session died
};

class TaskTable {
 public:
  TaskTable(const messages::Limits& limits, TableOptions options, Sink& sink);
  ~TaskTable();
  TaskTable(const TaskTable&) = delete;
  TaskTable& operator=(const TaskTable&) = delete;

  // ---- submissions (decoded in place from the submit ring; the table copies
  // what it keeps and validates the copy, never the shared bytes). `session`
  // is the submitting engine session (records::session_id), 0 if unknown ----
  void on_cache_task(schema::CacheTask::Reader task, uint64_t now_ns, uint32_t session = 0);
  void on_cache_dest(schema::CacheDest::Reader dest, uint64_t now_ns, uint32_t session = 0);
  void on_swap(schema::SwapTask::Reader swap, uint64_t now_ns, uint32_t session = 0);
  void on_expect(schema::ExpectArrival::Reader expect, uint64_t now_ns, uint32_t session = 0);
  void on_connect(schema::ConnectTask::Reader connect, uint64_t now_ns, uint32_t session = 0);
  void on_cancel(schema::Cancel::Reader cancel, uint64_t now_ns, uint32_t session = 0);
  void on_register_pool(schema::RegisterPool::Reader reg, uint64_t now_ns, uint32_t session = 0);
  // A record that could not be decoded: it still gets one (rejected) completion.
  void on_malformed(const std::string& what, const std::string& error, uint64_t now_ns,
                    uint32_t session = 0);

  // ---- from the workers ----
  // `now_ns` is when the report was read: its hop from the worker's stamp
  // is timed, and so is the tail when it is the report that finished the
  // request (before the completion is written, so an engine that reads the
  // completion finds the tail already counted).
  void on_report(const records::WorkerReport& report, uint64_t now_ns);
  // Rank `rank` died (confirmed): every live request it held fails, naming
  // the rank; withdrawals it owed are settled.
  void on_rank_lost(uint32_t rank, const std::string& reason, uint64_t now_ns);
  // Whether new requests may be sent to `rank`. on_rank_lost() marks it down;
  // the coordinator marks it up when its replacement worker is started.
  void set_rank_up(uint32_t rank) {
    if (rank < down_.size()) down_[rank].reset();
  }

  // ---- engine sessions ----
  // `session` died: its requests are withdrawn without completions, and
  // their ids are free at once.
  void on_session_ended(uint32_t session, uint64_t now_ns);
  // Whether a session has live requests (the coordinator watches those).
  bool session_has_requests(uint32_t session) const;

  // Deadlines and tombstone expiry. Returns the next time tick() has work.
  uint64_t tick(uint64_t now_ns);

  // From now on new submissions are refused (error completions): the
  // instance is draining. Live requests continue.
  void start_draining() { draining_ = true; }
  // Fails every live request (shutdown after the drain deadline).
  void fail_all(const std::string& reason, uint64_t now_ns);

  size_t live() const { return by_handle_.size() - retired_.size(); }
  size_t remembered() const { return tombstones_.size(); }
  const TableCounters& counters() const { return counters_; }

 private:
  struct Request;
  enum class Half { kTask, kDest };
  // What an entry point found already answered: nothing more to do.
  struct Answered {};

  using HandleMap = std::unordered_map<uint64_t, std::unique_ptr<Request>>;
  using IdMap = StringKeyMap<Request*>;
  using Timers = std::multimap<uint64_t, uint64_t>;

  Request* find_live(std::string_view id);
  Request& create(std::string_view id, CompletionKind kind, uint64_t now_ns, uint32_t deadline_ms,
                  uint32_t session);

  // ---- admission: the checks a submission passes before its request exists ----
  // Both halves of a cache request: a well-formed id, not a second copy of a
  // half the live request already has, absorbed (or rejected as a duplicate)
  // when its request already ended, and room for a new request. Returns the
  // live request the half joins (nullptr: it starts one), or Answered.
  std::variant<Request*, Answered> admit_half(Half half, capnp::Text::Reader id, uint64_t now_ns,
                                              uint32_t session);
  // A half that failed validation: it fails the request it joined, or, alone,
  // gets its error completion and its id is remembered.
  void refuse_half(Request* joined, Half half, std::string_view id, const std::string& error,
                   uint64_t now_ns, uint32_t session);
  // A single-part request (swap, expect, connect, register-pool): not a
  // duplicate of a live one (nor, unless `reusable_id`, of one that recently
  // ended), and room for it. False when it was answered.
  bool admit_single(std::string_view id, CompletionKind kind, const char* what, bool reusable_id,
                    uint64_t now_ns, uint32_t session);
  // The same for a request whose id the engine chose: the id must be well
  // formed, and is never reused while remembered. Returns the id (a view of
  // `id`), or nullopt when the request was answered.
  std::optional<std::string_view> admit_single(capnp::Text::Reader id, CompletionKind kind,
                                               const char* what, uint64_t now_ns,
                                               uint32_t session);
  // A single-part request that failed validation: its error completion, and
  // its id is remembered.
  void refuse_single(std::string_view id, CompletionKind kind, const std::string& error,
                     uint64_t now_ns, uint32_t session);
  // Room for one more request (draining, capacity); false when refused (and answered).
  bool has_room(std::string_view id, CompletionKind kind, uint64_t now_ns, uint32_t session);

  void maybe_dispatch_dest(Request& r, uint64_t now_ns);
  // Sends a part of `r` to every rank. When a rank is down it sends nothing,
  // ends `r` with an error naming the rank, and returns false.
  template <class Fill>
  bool send_to_ranks(Request& r, Fill&& fill, uint64_t now_ns);
  std::optional<std::string> down_reason(uint32_t rank) const;
  void time_submission(uint64_t client_submit_ns, uint64_t now_ns);
  void send_cancel(Request& r);
  // Ends `r`: at once if it finished or no rank can still write for it,
  // otherwise once every such rank has confirmed (see the top).
  void finish(Request& r, CompletionStatus status, int32_t error_rank, const std::string& message,
              uint64_t now_ns);
  // Arms r's one timer for its phase: its deadline, or the limit of a withdrawal.
  void arm_timer(Request& r, uint64_t at_ns);
  void on_timer(Request& r, uint64_t now_ns);
  // Sends r's completion (unless its session is gone) and retires r: it is
  // no longer live, and is freed when the entry point returns (reap()), so
  // that no caller is left holding a destroyed request.
  void emit(Request& r, uint64_t now_ns);
  void reap();
  bool writers_settled(const Request& r) const;
  void complete_unknown(std::string_view id, CompletionKind kind, CompletionStatus status,
                        const std::string& message, uint64_t now_ns, uint32_t session);
  void remember(std::string_view id, Tombstones::Halves halves, Nanos deadline, uint64_t now_ns);
  void arm_new_timer(Request& r, uint64_t at_ns);
  void disarm_timer(Request& r);
  // r's id is free for a new request (it leaves by_id_).
  void release_id(Request& r);
  std::optional<std::string> check_peer(schema::CacheDest::Reader dest,
                                        std::optional<uint32_t>& peer_blocks);

  messages::Limits limits_;
  TableOptions options_;
  Sink& sink_;
  uint64_t next_handle_ = 1;
  bool draining_ = false;
  std::vector<std::optional<std::string>> down_;  // per rank: why it is down
  // Declared before the maps: their requests' copies go back to it.
  MessageCopies copies_;
  ScratchMessage::Space task_space_;        // WorkerTasks being sent
  ScratchMessage::Space completion_space_;  // completions being sent
  HandleMap by_handle_;
  IdMap by_id_;      // live requests that own their id
  Timers timers_;    // (due, handle) of live requests
  std::vector<uint64_t> retired_;  // emitted, freed by reap()
  // Nodes of requests that ended, kept for the next ones: a request node
  // keeps its Request (and its id's capacity).
  NodePool<HandleMap> spare_requests_;
  NodePool<IdMap> spare_ids_;
  NodePool<Timers> spare_timers_;
  Tombstones tombstones_;
  TableCounters counters_;
};

}  // namespace kvrelay::coordinator
