#include "coordinator/task_table.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bitset>
#include <map>

namespace kvrelay::coordinator {

namespace {

// Text from another process as it may be shown back: printable ASCII, the
// rest escaped, at most `max` bytes (marked when cut), so that any binding
// can decode it and every completion fits its ring.
std::string printable(std::string_view in, size_t max) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    const auto b = static_cast<unsigned char>(in[i]);
    const size_t before = out.size();
    if (b >= 0x20 && b < 0x7f) {
      out.push_back(static_cast<char>(b));
    } else {
      out += fmt::format("\\x{:02x}", b);
    }
    if (out.size() > max) {
      out.resize(before);
      out += fmt::format("... [{} more bytes]", in.size() - i);
      break;
    }
  }
  return out;
}

std::string printable_id(capnp::Text::Reader id) {
  return printable(std::string_view(id.cStr(), id.size()), messages::kMaxRequestIdBytes);
}

std::string text(capnp::Text::Reader t) {
  return std::string(t.cStr(), t.size());
}

// A view of a message's text, valid while the message is.
std::string_view view(capnp::Text::Reader t) {
  return {t.cStr(), t.size()};
}

Nanos deadline_of(uint32_t deadline_ms, Nanos default_deadline) {
  return deadline_ms != 0 ? Nanos(std::chrono::milliseconds(deadline_ms)) : default_deadline;
}

// Copies kept for reuse, and the largest kept (words): at most 16 MiB idle.
constexpr size_t kSpareCopies = 512;
constexpr size_t kSpareCopyWords = 4096;
// Requests (with their map and timer nodes) kept for reuse.
constexpr size_t kSpareRequests = 4096;
// First segments of the messages the table sends (words): a WorkerTask
// carries a CacheTask or CacheDest whole; a completion's message is cut to
// kMaxCompletionMessageBytes.
constexpr size_t kTaskScratchWords = 8192;
constexpr size_t kCompletionScratchWords = 512;

}  // namespace

// The types of TaskTable::Request's fields are outside the anonymous
// namespace: a unity build includes this file into a batch, where GCC
// warns about a named type with fields of anonymous types.
enum class RankState : uint8_t { kIdle, kPending, kFinished, kCancelled, kFailed };

// A submitted message, decoded once: the table's own exactly-sized copy
// (validated and forwarded, never the shared bytes) and its root.
template <class T>
struct Owned {
  MessageCopies::Copy copy;
  typename T::Reader root;

  Owned(typename T::Reader shared, MessageCopies& copies)
      : copy(copies.copy(shared)),
        root(copy.message().getRoot<T>().asReader()) {}  // stays valid: the buffer does not move
};

// Where a request is in its life: which of its timers runs, and what a
// rank's answer means.
enum class Phase : uint8_t {
  kRunning,        // live: its deadline runs
  kWithdrawing,    // its outcome is decided; the ranks that may still write
                   // are asked to stop, until the withdraw timeout
  kAwaitingExits,  // ranks that did not confirm in time were stopped; their
                   // exits are awaited, until a second withdraw timeout
  kRetired,        // its completion went out; freed by reap()
};

// How a request ended, decided before its completion may go out.
struct Outcome {
  CompletionStatus status = CompletionStatus::FINISHED;
  int32_t error_rank = -1;
  std::string message;
};

struct TaskTable::Request {
  std::string id;
  uint64_t handle = 0;
  CompletionKind kind = CompletionKind::CACHE;
  uint32_t session = 0;
  uint64_t submitted_ns = 0;
  Nanos deadline{0};  // how long it has from submitted_ns
  Phase phase = Phase::kRunning;
  // Its one entry in timers_, due when its phase says (see Phase).
  std::multimap<uint64_t, uint64_t>::iterator timer;
  std::optional<Owned<schema::CacheTask>> task;
  std::optional<Owned<schema::CacheDest>> dest;
  bool task_bound = false;
  bool dest_sent = false;
  std::vector<RankState> ranks;
  uint64_t bytes = 0;
  uint64_t first_copy_ns = 0;                      // the earliest rank's first copy (0: none yet)
  uint32_t progress_slot = Sink::kNoProgressSlot;  // swap loads: per-layer progress
  uint32_t progress_generation = 0;
  bool owns_id = true;  // in by_id_ (false once its session died: the id is free)
  bool silent = false;  // its session died: nobody is left to read a completion
  Outcome outcome;      // meaningful from kWithdrawing on
  bool blocks_reusable = true;

  uint64_t deadline_ns() const { return submitted_ns + ns_of(deadline); }
  bool ending() const { return phase != Phase::kRunning; }
  // Whether the ranks may write into pools for it (a decode half was
  // dispatched, or it is a swap): then its end waits for them.
  bool can_write() const {
    return kind == CompletionKind::SWAP || kind == CompletionKind::ARRIVED ||
           (kind == CompletionKind::CACHE && dest_sent);
  }
  // What it still waits for, as a timeout's message says it: which ranks
  // have not reported, and which had finished (so that the operator knows
  // where to look: that rank's log and kvrelay-dump's stalled requests).
  std::string waiting_for() const {
    if (kind == CompletionKind::CACHE && !dest_sent)
      return task ? "waiting for its CacheDest" : "waiting for its CacheTask";
    std::vector<uint32_t> working, finished;
    for (uint32_t rank = 0; rank < ranks.size(); ++rank) {
      if (ranks[rank] == RankState::kPending) working.push_back(rank);
      if (ranks[rank] == RankState::kFinished) finished.push_back(rank);
    }
    auto names = [](const std::vector<uint32_t>& list) {
      return fmt::format("{} {}", list.size() == 1 ? "rank" : "ranks", fmt::join(list, ", "));
    };
    if (working.empty()) return "the ranks were still working";
    return fmt::format("{} {} still working{}", names(working),
                       working.size() == 1 ? "was" : "were",
                       finished.empty() ? "" : fmt::format(" ({} had finished)", names(finished)));
  }
};

TaskTable::TaskTable(const messages::Limits& limits, TableOptions options, Sink& sink)
    : limits_(limits),
      options_(std::move(options)),
      sink_(sink),
      down_(limits.tp_size),
      copies_(kSpareCopies, kSpareCopyWords),
      task_space_(kTaskScratchWords),
      completion_space_(kCompletionScratchWords),
      spare_requests_(kSpareRequests),
      spare_ids_(kSpareRequests),
      spare_timers_(kSpareRequests),
      tombstones_(options_.max_tombstones) {}

TaskTable::~TaskTable() = default;

TaskTable::Request* TaskTable::find_live(std::string_view id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

TaskTable::Request& TaskTable::create(std::string_view id, CompletionKind kind, uint64_t now_ns,
                                      uint32_t deadline_ms, uint32_t session) {
  const uint64_t handle = next_handle_++;
  Request* r = nullptr;
  if (HandleMap::node_type node = spare_requests_.take(); !node.empty()) {
    // A retired request's node: every field back to its default, but the
    // id's and the ranks' storage kept.
    r = node.mapped().get();
    std::string kept_id = std::move(r->id);
    std::vector<RankState> kept_ranks = std::move(r->ranks);
    std::string kept_message = std::move(r->outcome.message);
    *r = Request{};
    r->id = std::move(kept_id);
    r->ranks = std::move(kept_ranks);
    r->outcome.message = std::move(kept_message);
    r->outcome.message.clear();
    node.key() = handle;
    by_handle_.insert(std::move(node));
  } else {
    r = by_handle_.emplace(handle, std::make_unique<Request>()).first->second.get();
  }
  r->id.assign(id);
  r->handle = handle;
  r->kind = kind;
  r->session = session;
  r->submitted_ns = now_ns;
  r->deadline = deadline_of(deadline_ms, options_.default_deadline);
  r->ranks.assign(limits_.tp_size, RankState::kIdle);
  arm_new_timer(*r, r->deadline_ns());
  spare_ids_.put(by_id_, id, r);
  ++counters_.submitted;
  return *r;
}

bool TaskTable::has_room(std::string_view id, CompletionKind kind, uint64_t now_ns,
                         uint32_t session) {
  if (draining_) {
    complete_unknown(id, kind, CompletionStatus::ERROR,
                     fmt::format("'{}' refused: the instance is draining (shutting down)", id),
                     now_ns, session);
    return false;
  }
  if (live() >= options_.max_live_requests) {
    complete_unknown(id, kind, CompletionStatus::ERROR,
                     fmt::format("'{}' refused: {} requests are in flight, the most this instance "
                                 "takes; resubmit once some have completed",
                                 id, live()),
                     now_ns, session);
    return false;
  }
  // Every request needs a tombstone when it ends: keep room for all of them.
  if (tombstones_.size() + live() >= tombstones_.limit()) {
    tombstones_.sweep(now_ns, tombstones_.capacity());
    if (tombstones_.size() + live() >= tombstones_.limit()) {
      complete_unknown(
          id, kind, CompletionStatus::ERROR,
          fmt::format(
              "'{}' refused: this instance remembers {} recently completed "
              "request ids, the most it can (each for its deadline plus "
              "{} s); resubmit once they expire",
              id, tombstones_.size(),
              std::chrono::duration_cast<std::chrono::seconds>(options_.tombstone_margin).count()),
          now_ns, session);
      return false;
    }
  }
  return true;
}

std::variant<TaskTable::Request*, TaskTable::Answered> TaskTable::admit_half(
    Half half, capnp::Text::Reader id_text, uint64_t now_ns, uint32_t session) {
  const char* what = half == Half::kTask ? "CacheTask" : "CacheDest";
  if (Status s = messages::validate_request_id(what, id_text); !s) {
    complete_unknown(printable_id(id_text), CompletionKind::CACHE, CompletionStatus::REJECTED,
                     s.error().message, now_ns, session);
    return Answered{};
  }
  const std::string_view id = view(id_text);
  Request* live = find_live(id);
  if (live != nullptr) {
    const bool has_half = half == Half::kTask ? live->task.has_value() : live->dest.has_value();
    if (live->kind != CompletionKind::CACHE || has_half) {
      complete_unknown(id, CompletionKind::CACHE, CompletionStatus::REJECTED,
                       fmt::format("{} '{}': duplicate; a request with this id is in flight "
                                   "(this one was dropped, the first continues)",
                                   what, id),
                       now_ns, session);
      return Answered{};
    }
    return live;
  }
  // Not live but recently ended: its partner half is absorbed; a half that
  // was already seen is a duplicate.
  if (std::optional<Tombstones::Halves> seen = tombstones_.find(id, now_ns)) {
    bool& this_half = half == Half::kTask ? seen->task : seen->dest;
    if (this_half) {
      complete_unknown(
          id, CompletionKind::CACHE, CompletionStatus::REJECTED,
          fmt::format("{} '{}': duplicate; this request id already completed", what, id), now_ns,
          session);
      return Answered{};
    }
    this_half = true;
    tombstones_.mark(id, *seen);
    ++counters_.absorbed;
    spdlog::info("{} '{}' arrived after its request had completed; absorbed", what, id);
    return Answered{};
  }
  if (!has_room(id, CompletionKind::CACHE, now_ns, session)) return Answered{};
  return static_cast<Request*>(nullptr);
}

void TaskTable::refuse_half(Request* joined, Half half, std::string_view id,
                            const std::string& error, uint64_t now_ns, uint32_t session) {
  if (joined != nullptr) {
    finish(*joined, CompletionStatus::ERROR, -1, error, now_ns);
    return;
  }
  complete_unknown(id, CompletionKind::CACHE, CompletionStatus::ERROR, error, now_ns, session);
  remember(id, Tombstones::Halves{half == Half::kTask, half == Half::kDest}, Nanos(0), now_ns);
}

std::optional<std::string_view> TaskTable::admit_single(capnp::Text::Reader id_text,
                                                        CompletionKind kind, const char* what,
                                                        uint64_t now_ns, uint32_t session) {
  if (Status s = messages::validate_request_id(what, id_text); !s) {
    complete_unknown(printable_id(id_text), kind, CompletionStatus::REJECTED, s.error().message,
                     now_ns, session);
    return std::nullopt;
  }
  const std::string_view id = view(id_text);
  if (!admit_single(id, kind, what, false, now_ns, session)) return std::nullopt;
  return id;
}

void TaskTable::refuse_single(std::string_view id, CompletionKind kind, const std::string& error,
                              uint64_t now_ns, uint32_t session) {
  complete_unknown(id, kind, CompletionStatus::ERROR, error, now_ns, session);
  remember(id, Tombstones::Halves{true, true}, Nanos(0), now_ns);
}

bool TaskTable::admit_single(std::string_view id, CompletionKind kind, const char* what,
                             bool reusable_id, uint64_t now_ns, uint32_t session) {
  if (find_live(id) != nullptr || (!reusable_id && tombstones_.find(id, now_ns))) {
    complete_unknown(id, kind, CompletionStatus::REJECTED,
                     fmt::format("{} '{}': duplicate; a request with this id {}", what, id,
                                 find_live(id) != nullptr ? "is in flight" : "recently completed"),
                     now_ns, session);
    return false;
  }
  return has_room(id, kind, now_ns, session);
}

void TaskTable::on_cache_task(schema::CacheTask::Reader shared, uint64_t now_ns, uint32_t session) {
  time_submission(shared.getClientSubmitNs(), now_ns);
  Owned<schema::CacheTask> task(shared, copies_);
  const auto admitted = admit_half(Half::kTask, task.root.getRequestId(), now_ns, session);
  if (std::holds_alternative<Answered>(admitted)) return reap();
  Request* joined = std::get<Request*>(admitted);
  const std::string_view id = view(task.root.getRequestId());  // lives as long as the copy
  const uint32_t deadline_ms = task.root.getDeadlineMs();
  if (Status s = messages::validate(task.root, limits_); !s) {
    if (joined != nullptr) joined->task = std::move(task);
    refuse_half(joined, Half::kTask, id, s.error().message, now_ns, session);
    return reap();
  }
  Request& r =
      joined != nullptr ? *joined : create(id, CompletionKind::CACHE, now_ns, deadline_ms, session);
  if (joined != nullptr && deadline_ms != 0) {  // the task's own deadline, from first arrival
    r.deadline = deadline_of(deadline_ms, options_.default_deadline);
    arm_timer(r, r.deadline_ns());
  }
  r.task = std::move(task);
  spdlog::debug("CacheTask '{}' (handle {}) bound on every rank", id, r.handle);
  const bool sent = send_to_ranks(
      r, [&](schema::WorkerTask::Builder w) { w.setBind(r.task->root); }, now_ns);
  if (sent) {
    r.task_bound = true;
    maybe_dispatch_dest(r, now_ns);
  }
  reap();
}

// The destination of an ipc transfer must be another instance that accepts
// transfers (decode), and device_ids must name its ranks, each once (when
// both have the same TP size).
std::optional<std::string> TaskTable::check_peer(schema::CacheDest::Reader dest,
                                                 std::optional<uint32_t>& peer_blocks) {
  if (dest.getProtocol() != schema::TransferProtocol::IPC) return std::nullopt;
  // Nothing here allocates unless it refuses (the dispatch path).
  const auto id = [&] { return printable_id(dest.getRequestId()); };
  const std::string_view peer = view(dest.getPeerInstance());
  if (!options_.own_instance.empty() && peer == options_.own_instance)
    return fmt::format(
        "CacheDest '{}': peer_instance '{}' is this instance itself; a transfer "
        "goes to another (decode) instance",
        id(), peer);
  if (!options_.peer_info) return std::nullopt;
  const std::optional<PeerInfo> info = options_.peer_info(peer);
  if (!info) return std::nullopt;  // unknown here: the worker checks when it attaches
  if (info->role != Role::kDecode)
    return fmt::format(
        "CacheDest '{}': peer_instance '{}' has role {}; only a decode instance "
        "accepts transfers",
        id(), peer, role_name(info->role));
  peer_blocks = info->num_blocks;
  // Heterogeneous TP: the workers write where the head split says
  // (instance/head_layout.h); device_ids is not consulted.
  if (options_.own_tp_size != 0 && info->tp_size != options_.own_tp_size) return std::nullopt;
  const auto devices = dest.getDeviceIds();
  std::bitset<kMaxTpSize> used;
  for (uint32_t i = 0; i < devices.size(); ++i) {
    const uint32_t d = devices[i];
    if (d >= info->tp_size || d >= kMaxTpSize)
      return fmt::format(
          "CacheDest '{}': device_ids[{}] = {} is out of range: decode instance "
          "'{}' has {} ranks",
          id(), i, d, peer, info->tp_size);
    if (used[d])
      return fmt::format(
          "CacheDest '{}': device_ids names decode rank {} twice; each rank's "
          "blocks go to a rank of their own",
          id(), d);
    used[d] = true;
  }
  return std::nullopt;
}

void TaskTable::on_cache_dest(schema::CacheDest::Reader shared, uint64_t now_ns, uint32_t session) {
  time_submission(shared.getClientSubmitNs(), now_ns);
  Owned<schema::CacheDest> dest(shared, copies_);
  const auto admitted = admit_half(Half::kDest, dest.root.getRequestId(), now_ns, session);
  if (std::holds_alternative<Answered>(admitted)) return reap();
  Request* joined = std::get<Request*>(admitted);
  const std::string_view id = view(dest.root.getRequestId());  // lives as long as the copy
  std::string error;
  std::optional<uint32_t> peer_blocks;
  if (dest.root.getErrorMessage().size() > 0) {
    error = fmt::format("CacheDest '{}': the decode side refused: {}", id,
                        printable(text(dest.root.getErrorMessage()), kMaxEchoedTextBytes));
  } else if (Status s = messages::validate(dest.root, limits_); !s) {
    error = s.error().message;
  } else if (auto why = check_peer(dest.root, peer_blocks)) {
    error = *why;
  } else if (peer_blocks) {
    if (Status p = messages::validate(dest.root, limits_, peer_blocks); !p)
      error = p.error().message;
  }
  if (!error.empty()) {
    if (joined != nullptr) joined->dest = std::move(dest);
    refuse_half(joined, Half::kDest, id, error, now_ns, session);
    return reap();
  }
  Request& r = joined != nullptr ? *joined : create(id, CompletionKind::CACHE, now_ns, 0, session);
  r.dest = std::move(dest);
  maybe_dispatch_dest(r, now_ns);
  reap();
}

void TaskTable::maybe_dispatch_dest(Request& r, uint64_t now_ns) {
  if (!r.task || !r.dest || r.dest_sent || r.ending()) return;
  const auto dest = r.dest->root;
  if (Status s = messages::validate_pair(r.task->root, dest); !s) {
    finish(r, CompletionStatus::ERROR, -1, s.error().message, now_ns);
    return;
  }
  if (!send_to_ranks(
          r, [&](schema::WorkerTask::Builder w) { w.setDest(dest); }, now_ns))
    return;
  r.dest_sent = true;
}

void TaskTable::on_swap(schema::SwapTask::Reader shared, uint64_t now_ns, uint32_t session) {
  Owned<schema::SwapTask> swap(shared, copies_);
  const std::optional<std::string_view> admitted =
      admit_single(swap.root.getRequestId(), CompletionKind::SWAP, "SwapTask", now_ns, session);
  if (!admitted) return;
  const std::string_view id = *admitted;
  if (Status s = messages::validate(swap.root, limits_); !s)
    return refuse_single(id, CompletionKind::SWAP, s.error().message, now_ns, session);
  Request& r = create(id, CompletionKind::SWAP, now_ns, swap.root.getDeadlineMs(), session);
  if (swap.root.getDirection() == schema::SwapTask::Direction::LOAD) {
    const uint32_t first = swap.root.getFirstLayer();
    const uint32_t count =
        swap.root.getLayerCount() != 0 ? swap.root.getLayerCount() : limits_.total_layers() - first;
    r.progress_slot =
        sink_.begin_load_progress(r.handle, r.id, first, count, r.progress_generation);
  }
  send_to_ranks(
      r,
      [&](schema::WorkerTask::Builder w) {
        w.setSwap(swap.root);
        w.setProgressSlot(r.progress_slot);
        w.setProgressGeneration(r.progress_generation);
      },
      now_ns);
  reap();
}

// The decode engine's word that a request's KV will arrive (tcp or ipc)
// into these blocks: every rank tracks it, and its completion (kind
// arrived) comes when every rank has every byte.
void TaskTable::on_expect(schema::ExpectArrival::Reader shared, uint64_t now_ns, uint32_t session) {
  Owned<schema::ExpectArrival> expect(shared, copies_);
  const std::optional<std::string_view> admitted = admit_single(
      expect.root.getRequestId(), CompletionKind::ARRIVED, "ExpectArrival", now_ns, session);
  if (!admitted) return;
  const std::string_view id = *admitted;
  if (Status s = messages::validate(expect.root, limits_); !s)
    return refuse_single(id, CompletionKind::ARRIVED, s.error().message, now_ns, session);
  Request& r = create(id, CompletionKind::ARRIVED, now_ns, expect.root.getDeadlineMs(), session);
  send_to_ranks(
      r, [&](schema::WorkerTask::Builder w) { w.setExpect(expect.root); }, now_ns);
  reap();
}

void TaskTable::on_connect(schema::ConnectTask::Reader shared, uint64_t now_ns, uint32_t session) {
  Owned<schema::ConnectTask> connect(shared, copies_);
  const std::string id = fmt::format("connect-{}", connect.root.getTaskId());
  // Connect ids may be reused once done.
  if (!admit_single(id, CompletionKind::CONNECT, "ConnectTask", true, now_ns, session)) return;
  if (Status s = messages::validate(connect.root, limits_); !s) {
    complete_unknown(id, CompletionKind::CONNECT, CompletionStatus::ERROR, s.error().message,
                     now_ns, session);
    return;
  }
  tombstones_.forget(id);
  Request& r = create(id, CompletionKind::CONNECT, now_ns, 0, session);
  send_to_ranks(
      r, [&](schema::WorkerTask::Builder w) { w.setConnect(connect.root); }, now_ns);
  reap();
}

void TaskTable::on_register_pool(schema::RegisterPool::Reader shared, uint64_t now_ns,
                                 uint32_t session) {
  Owned<schema::RegisterPool> reg(shared, copies_);
  if (Status s = messages::validate(reg.root, limits_); !s) {
    complete_unknown("register-pool", CompletionKind::REGISTER_POOL, CompletionStatus::ERROR,
                     s.error().message, now_ns, session);
    return;
  }
  const auto pool = reg.root.getPool();
  const std::string id =
      fmt::format("register-pool-r{}-{}", pool.getRank(),
                  pool.getTier() == schema::PoolDescriptor::Tier::HOST ? "host" : "device");
  if (!admit_single(id, CompletionKind::REGISTER_POOL, "RegisterPool", true, now_ns, session))
    return;
  if (auto why = down_reason(pool.getRank())) {
    complete_unknown(id, CompletionKind::REGISTER_POOL, CompletionStatus::ERROR, *why, now_ns,
                     session);
    return;
  }
  tombstones_.forget(id);
  Request& r = create(id, CompletionKind::REGISTER_POOL, now_ns, 0, session);
  // Only the pool's own rank takes part.
  r.ranks[pool.getRank()] = RankState::kPending;
  ScratchMessage msg(task_space_);
  auto w = msg->initRoot<schema::WorkerTask>();
  w.setHandle(r.handle);
  w.setRequestId(id);
  w.setRegisterPool(pool);
  sink_.to_worker(pool.getRank(), *msg);
}

void TaskTable::on_cancel(schema::Cancel::Reader shared, uint64_t now_ns, uint32_t session) {
  const std::string id = printable_id(shared.getRequestId());
  if (Status s = messages::validate_request_id("Cancel", shared.getRequestId()); !s) {
    complete_unknown(id, CompletionKind::CANCEL, CompletionStatus::REJECTED, s.error().message,
                     now_ns, session);
    return;
  }
  Request* r = find_live(id);
  if (r == nullptr) {
    complete_unknown(id, CompletionKind::CANCEL, CompletionStatus::REJECTED,
                     tombstones_.find(id, now_ns)
                         ? fmt::format("Cancel '{}': the request already completed", id)
                         : fmt::format("Cancel '{}': no live request has this id", id),
                     now_ns, session);
    return;
  }
  if (r->ending()) return;  // already being withdrawn; its one completion follows
  // Withdrawn from every rank like any other end: its completion waits for
  // the ranks that may still write (at once when nothing was sent yet), and
  // a rank that does not confirm in time is stopped.
  finish(*r, CompletionStatus::CANCELLED, -1,
         r->kind == CompletionKind::CACHE && !r->dest_sent
             ? "cancelled before both halves had arrived"
             : "cancelled",
         now_ns);
  reap();
}

void TaskTable::on_malformed(const std::string& what, const std::string& error, uint64_t now_ns,
                             uint32_t session) {
  complete_unknown("", CompletionKind::OTHER, CompletionStatus::REJECTED,
                   fmt::format("{} record refused: {}", what, error), now_ns, session);
}

void TaskTable::on_report(const records::WorkerReport& report, uint64_t now_ns) {
  // The stamp is the worker's: timed only when it is sane.
  const std::optional<uint64_t> waited = stamp_age(report.reported_ns, now_ns);
  if (waited) sink_.observe_hop(kReportWrittenToReadNs, *waited);
  auto it = by_handle_.find(report.handle);
  if (it == by_handle_.end() || report.rank >= limits_.tp_size) {
    ++counters_.stray_reports;
    return;
  }
  Request& r = *it->second;
  RankState& state = r.ranks[report.rank];
  if (state != RankState::kPending) {
    ++counters_.stray_reports;
    return;
  }
  if (report.first_copy_ns != 0 && (r.first_copy_ns == 0 || report.first_copy_ns < r.first_copy_ns))
    r.first_copy_ns = report.first_copy_ns;
  if (r.ending()) {  // being withdrawn: any answer means this rank stopped
    state = RankState::kCancelled;
    if (writers_settled(r)) emit(r, now_ns);
    reap();
    return;
  }
  using records::ReportKind;
  switch (static_cast<ReportKind>(report.kind)) {
    case ReportKind::kFinished:
    case ReportKind::kConnected:
    case ReportKind::kPoolRegistered:
      state = RankState::kFinished;
      r.bytes += report.bytes_moved;
      break;
    case ReportKind::kCancelled: state = RankState::kCancelled; break;
    case ReportKind::kFailed:
    case ReportKind::kConnectFailed:
    case ReportKind::kPoolRejected: {
      state = RankState::kFailed;
      const std::string why = fmt::format("rank {}: {}", report.rank,
                                          printable(report.message_text(), kMaxEchoedTextBytes));
      finish(r, CompletionStatus::ERROR, static_cast<int32_t>(report.rank), why, now_ns);
      reap();
      return;
    }
    default: ++counters_.stray_reports; return;
  }
  bool all_finished = true;
  bool all_settled = true;
  for (RankState s : r.ranks) {
    if (s == RankState::kPending) all_settled = false;
    if (s == RankState::kPending || s == RankState::kCancelled) all_finished = false;
  }
  if (!all_settled) return;
  if (all_finished) {
    // Timed before the completion is written: once it is, the engine may
    // read it and the tail's histogram at once.
    if (waited) sink_.observe_hop(kLastReportWrittenToReadNs, *waited);
    finish(r, CompletionStatus::FINISHED, -1, "", now_ns);
  } else {
    finish(r, CompletionStatus::CANCELLED, -1, "cancelled", now_ns);
  }
  reap();
}

void TaskTable::on_rank_lost(uint32_t rank, const std::string& reason, uint64_t now_ns) {
  if (rank < down_.size()) down_[rank] = reason;
  // Requests retire during the walk but are freed only by reap(), after it.
  for (auto& [handle, owned] : by_handle_) {
    Request& r = *owned;
    if (r.phase == Phase::kRetired || rank >= r.ranks.size() ||
        r.ranks[rank] != RankState::kPending)
      continue;
    r.ranks[rank] = RankState::kFailed;  // a dead rank writes nothing more
    if (r.ending()) {
      if (writers_settled(r)) emit(r, now_ns);
      continue;
    }
    finish(r, CompletionStatus::ERROR, static_cast<int32_t>(rank),
           fmt::format("rank {} died ({}) while the request was in flight", rank, reason), now_ns);
  }
  reap();
}

void TaskTable::on_session_ended(uint32_t session, uint64_t now_ns) {
  size_t withdrawn = 0;
  for (auto& [handle, owned] : by_handle_) {
    Request& r = *owned;
    if (r.session != session || r.silent || r.phase == Phase::kRetired) continue;
    r.silent = true;
    release_id(r);
    ++counters_.session_withdrawals;
    ++withdrawn;
    if (!r.ending()) finish(r, CompletionStatus::CANCELLED, -1, "its engine session ended", now_ns);
  }
  reap();
  if (withdrawn != 0)
    spdlog::info("engine session {:08x} ended: withdrew its {} requests", session, withdrawn);
}

bool TaskTable::session_has_requests(uint32_t session) const {
  return std::any_of(by_handle_.begin(), by_handle_.end(),
                     [&](const auto& e) { return e.second->session == session; });
}

uint64_t TaskTable::tick(uint64_t now_ns) {
  while (!timers_.empty() && timers_.begin()->first <= now_ns) {
    auto it = by_handle_.find(timers_.begin()->second);
    if (it == by_handle_.end() || it->second->phase == Phase::kRetired) {
      spare_timers_.erase(timers_, timers_.begin());  // not expected: retiring erases the timer
      continue;
    }
    on_timer(*it->second, now_ns);  // re-arms or retires: the entry moves or goes
  }
  reap();
  tombstones_.sweep(now_ns, 4096);
  return timers_.empty() ? UINT64_MAX : timers_.begin()->first;
}

void TaskTable::on_timer(Request& r, uint64_t now_ns) {
  switch (r.phase) {
    case Phase::kRunning: {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(r.deadline).count();
      finish(r, CompletionStatus::TIMEOUT, -1,
             fmt::format("'{}' passed its {} ms deadline while {}", r.id, ms, r.waiting_for()),
             now_ns);
      return;
    }
    case Phase::kWithdrawing:
    case Phase::kAwaitingExits: break;
    case Phase::kRetired: return;  // its timer went with it (tick() skips it)
  }
  // Ranks that have not confirmed the withdrawal in time.
  std::string unconfirmed;
  bool awaiting_exits = false;
  for (uint32_t rank = 0; rank < r.ranks.size(); ++rank) {
    if (r.ranks[rank] != RankState::kPending) continue;
    unconfirmed += fmt::format("{}{}", unconfirmed.empty() ? "" : ", ", rank);
    if (r.phase == Phase::kWithdrawing &&
        sink_.rank_unresponsive(rank,
                                fmt::format("did not confirm withdrawing '{}' in time", r.id))) {
      awaiting_exits = true;  // killed: its exit settles it (on_rank_lost)
    } else {
      r.ranks[rank] = RankState::kFailed;
      r.blocks_reusable = false;
    }
  }
  if (awaiting_exits) {
    r.phase = Phase::kAwaitingExits;
    arm_timer(r, now_ns + ns_of(options_.withdraw_timeout));
    return;
  }
  r.outcome.message += fmt::format(
      " (rank {} did not confirm it stopped writing in time{}: do not reuse the destination "
      "blocks until it is known to have stopped)",
      unconfirmed,
      r.phase == Phase::kAwaitingExits ? ", and its exit was not confirmed in time" : "");
  emit(r, now_ns);
}

void TaskTable::fail_all(const std::string& reason, uint64_t now_ns) {
  for (auto& [handle, owned] : by_handle_) {
    Request& r = *owned;
    if (r.phase == Phase::kRetired) continue;
    // The instance is going away with its workers: nothing to wait for.
    for (RankState& st : r.ranks)
      if (st == RankState::kPending) st = RankState::kCancelled;
    if (!r.ending()) r.outcome = Outcome{CompletionStatus::ERROR, -1, reason};
    emit(r, now_ns);
  }
  reap();
}

std::optional<std::string> TaskTable::down_reason(uint32_t rank) const {
  if (rank >= down_.size() || !down_[rank]) return std::nullopt;
  return fmt::format(
      "rank {} is down ({}) and not yet restarted; nothing was started, resubmit "
      "once the instance is ready again",
      rank, *down_[rank]);
}

template <class Fill>
bool TaskTable::send_to_ranks(Request& r, Fill&& fill, uint64_t now_ns) {
  for (uint32_t rank = 0; rank < limits_.tp_size; ++rank) {
    if (auto why = down_reason(rank)) {
      finish(r, CompletionStatus::ERROR, static_cast<int32_t>(rank),
             fmt::format("'{}': {}", r.id, *why), now_ns);
      return false;
    }
  }
  // Encoded once: every rank gets the same task.
  ScratchMessage msg(task_space_);
  auto w = msg->initRoot<schema::WorkerTask>();
  w.setHandle(r.handle);
  w.setRequestId(r.id);
  fill(w);
  const uint64_t written_ns = mono_now_ns();
  w.setWrittenNs(written_ns);
  if (written_ns >= now_ns) sink_.observe_hop(kReadToTaskWrittenNs, written_ns - now_ns);
  sink_.expect_reports(r.handle, limits_.tp_size);  // before any rank can see the task
  for (uint32_t rank = 0; rank < limits_.tp_size; ++rank) {
    sink_.to_worker(rank, *msg);
    r.ranks[rank] = RankState::kPending;
  }
  return true;
}

// The stamp is the engine's: timed only when it is sane.
void TaskTable::time_submission(uint64_t client_submit_ns, uint64_t now_ns) {
  if (const auto waited = stamp_age(client_submit_ns, now_ns))
    sink_.observe_hop(kSubmitToReadNs, *waited);
}

void TaskTable::send_cancel(Request& r) {
  ScratchMessage msg(task_space_);
  auto w = msg->initRoot<schema::WorkerTask>();
  w.setHandle(r.handle);
  w.setRequestId(r.id);
  w.setCancel();
  for (uint32_t rank = 0; rank < r.ranks.size(); ++rank) {
    if (r.ranks[rank] == RankState::kPending) sink_.to_worker(rank, *msg);
  }
}

void TaskTable::finish(Request& r, CompletionStatus status, int32_t error_rank,
                       const std::string& message, uint64_t now_ns) {
  r.outcome = Outcome{status, error_rank, message};
  if (status == CompletionStatus::FINISHED) {
    emit(r, now_ns);
    return;
  }
  r.phase = Phase::kWithdrawing;
  send_cancel(r);  // withdraw it wherever it still runs
  if (writers_settled(r)) {
    emit(r, now_ns);
    return;
  }
  // Wait for the writers' confirmations, but not forever.
  arm_timer(r, now_ns + ns_of(options_.withdraw_timeout));
}

void TaskTable::arm_timer(Request& r, uint64_t at_ns) {
  disarm_timer(r);
  arm_new_timer(r, at_ns);
}

void TaskTable::arm_new_timer(Request& r, uint64_t at_ns) {
  r.timer = spare_timers_.put_multi(timers_, at_ns, r.handle);
}

void TaskTable::disarm_timer(Request& r) {
  spare_timers_.erase(timers_, r.timer);
}

void TaskTable::release_id(Request& r) {
  if (!r.owns_id) return;
  if (auto it = by_id_.find(r.id); it != by_id_.end()) spare_ids_.erase(by_id_, it);
  r.owns_id = false;
}

bool TaskTable::writers_settled(const Request& r) const {
  if (!r.can_write()) return true;
  return std::none_of(r.ranks.begin(), r.ranks.end(),
                      [](RankState st) { return st == RankState::kPending; });
}

void TaskTable::emit(Request& r, uint64_t now_ns) {
  if (r.phase == Phase::kRetired) return;
  if (r.progress_slot != Sink::kNoProgressSlot)
    sink_.end_load_progress(r.progress_slot, r.outcome.status == CompletionStatus::FINISHED);
  if (!r.silent) {
    ScratchMessage msg(completion_space_);
    auto c = msg->initRoot<schema::Completion>();
    c.setRequestId(r.id);
    c.setKind(r.kind);
    c.setStatus(r.outcome.status);
    c.setErrorRank(r.outcome.error_rank);
    c.setMessage(printable(r.outcome.message, kMaxCompletionMessageBytes));
    c.setBytesMoved(r.bytes);
    c.setSubmittedNs(r.submitted_ns);
    c.setCompletedNs(now_ns);
    c.setFirstCopyNs(r.first_copy_ns);
    c.setSession(r.session);
    c.setBlocksReusable(r.blocks_reusable);
    // Counted first: whoever reads the completion may look at the counters next.
    switch (r.outcome.status) {
      case CompletionStatus::FINISHED: ++counters_.finished; break;
      case CompletionStatus::ERROR: ++counters_.errors; break;
      case CompletionStatus::CANCELLED: ++counters_.cancelled; break;
      case CompletionStatus::TIMEOUT: ++counters_.timeouts; break;
      case CompletionStatus::REJECTED: ++counters_.rejected; break;
    }
    sink_.complete(*msg);
    if (r.outcome.status != CompletionStatus::FINISHED)
      spdlog::info("'{}' {}: {}", r.id,
                   r.outcome.status == CompletionStatus::ERROR ? "failed" : "ended",
                   r.outcome.message);
  }
  if (r.owns_id) {
    const bool single = r.kind != CompletionKind::CACHE;
    remember(r.id, Tombstones::Halves{single || r.task.has_value(), single || r.dest.has_value()},
             r.deadline, now_ns);
    release_id(r);
  }
  disarm_timer(r);
  r.phase = Phase::kRetired;
  retired_.push_back(r.handle);
}

void TaskTable::reap() {
  for (uint64_t handle : retired_) {
    auto it = by_handle_.find(handle);
    if (it == by_handle_.end()) continue;
    // Its copies go back now, not when the node is next reused.
    it->second->task.reset();
    it->second->dest.reset();
    spare_requests_.erase(by_handle_, it);
  }
  retired_.clear();
}

void TaskTable::complete_unknown(std::string_view id, CompletionKind kind,
                                 CompletionStatus status, const std::string& message,
                                 uint64_t now_ns, uint32_t session) {
  ScratchMessage msg(completion_space_);
  auto c = msg->initRoot<schema::Completion>();
  c.setRequestId(capnp::Text::Reader(id.data(), id.size()));
  c.setKind(kind);
  c.setStatus(status);
  c.setErrorRank(-1);
  c.setMessage(printable(message, kMaxCompletionMessageBytes));
  c.setSubmittedNs(now_ns);
  c.setCompletedNs(now_ns);
  c.setSession(session);
  c.setBlocksReusable(true);  // nothing was started for it
  ++(status == CompletionStatus::REJECTED ? counters_.rejected : counters_.errors);
  sink_.complete(*msg);
  if (status == CompletionStatus::REJECTED) {
    spdlog::debug("rejected: {}", message);  // the live request of that id is not affected
  } else {
    spdlog::info("{}", message);
  }
}

// `deadline`: how long the request had (its partner may come that long
// after its first half).
void TaskTable::remember(std::string_view id, Tombstones::Halves halves, Nanos deadline,
                         uint64_t now_ns) {
  const Nanos lifetime = std::max(deadline, options_.default_deadline) + options_.tombstone_margin;
  if (!tombstones_.remember(id, halves, now_ns + ns_of(lifetime), now_ns))
    spdlog::error(
        "could not remember completed id '{}': {} ids remembered, the most this "
        "instance holds",
        id, tombstones_.size());
}

}  // namespace kvrelay::coordinator
