#include "coordinator/task_table.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>

namespace kvrelay::coordinator {

namespace {

enum class RankState : uint8_t { kIdle, kPending, kFinished, kCancelled, kFailed };

// An owned, exactly-sized deep copy of a message read from shared memory.
template <class Reader>
std::unique_ptr<capnp::MallocMessageBuilder> copy_of(Reader reader) {
  const auto words = reader.totalSize().wordCount + 1;
  auto copy = std::make_unique<capnp::MallocMessageBuilder>(
      static_cast<unsigned>(std::min<uint64_t>(words, 1U << 20)));
  copy->setRoot(reader);
  return copy;
}

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

uint64_t deadline_ns_of(uint32_t deadline_ms, uint64_t default_ns) {
  return deadline_ms != 0 ? uint64_t{deadline_ms} * 1'000'000ULL : default_ns;
}

}  // namespace

struct TaskTable::Request {
  std::string id;
  uint64_t handle = 0;
  CompletionKind kind = CompletionKind::CACHE;
  uint32_t session = 0;
  uint64_t submitted_ns = 0;
  uint64_t deadline_ns = 0;
  // Its entry in deadlines_: the deadline while it runs, the limit of its
  // withdrawal once it ends.
  std::multimap<uint64_t, uint64_t>::iterator timer;
  std::unique_ptr<capnp::MallocMessageBuilder> task;  // CacheTask
  std::unique_ptr<capnp::MallocMessageBuilder> dest;  // CacheDest
  bool task_bound = false;
  bool dest_sent = false;
  std::vector<RankState> ranks;
  uint64_t bytes = 0;
  uint64_t first_copy_ns = 0;                      // the earliest rank's first copy (0: none yet)
  uint32_t progress_slot = Sink::kNoProgressSlot;  // swap loads: per-layer progress
  uint32_t progress_generation = 0;
  bool owns_id = true;  // in by_id_ (false once its session died: the id is free)
  bool silent = false;  // its session died: nobody is left to read a completion
  // Set once the outcome is decided; the completion waits for the writers.
  bool ending = false;
  CompletionStatus end_status = CompletionStatus::FINISHED;
  int32_t end_rank = -1;
  std::string end_message;
  // Withdrawal: 0 waiting for confirmations; 1 unresponsive ranks were
  // killed and their exits are awaited.
  int withdraw_round = 0;
  bool blocks_reusable = true;

  // Whether the ranks may write into pools for it (a decode half was
  // dispatched, or it is a swap): then its end waits for them.
  bool can_write() const {
    return kind == CompletionKind::SWAP || kind == CompletionKind::ARRIVED ||
           (kind == CompletionKind::CACHE && dest_sent);
  }
  std::string waiting_for() const {
    if (kind != CompletionKind::CACHE || dest_sent) return "the ranks were still working";
    return task ? "waiting for its CacheDest" : "waiting for its CacheTask";
  }
};

TaskTable::TaskTable(const messages::Limits& limits, TableOptions options, Sink& sink)
    : limits_(limits),
      options_(std::move(options)),
      sink_(sink),
      down_(limits.tp_size),
      tombstones_(options_.max_tombstones) {}

TaskTable::~TaskTable() = default;

TaskTable::Request* TaskTable::find_live(const std::string& id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

TaskTable::Request& TaskTable::create(const std::string& id, CompletionKind kind, uint64_t now_ns,
                                      uint32_t deadline_ms, uint32_t session) {
  auto r = std::make_unique<Request>();
  r->id = id;
  r->handle = next_handle_++;
  r->kind = kind;
  r->session = session;
  r->submitted_ns = now_ns;
  r->deadline_ns = now_ns + deadline_ns_of(deadline_ms, options_.default_deadline_ns);
  r->ranks.assign(limits_.tp_size, RankState::kIdle);
  r->timer = deadlines_.emplace(r->deadline_ns, r->handle);
  Request& ref = *r;
  by_id_[id] = &ref;
  by_handle_[ref.handle] = std::move(r);
  ++counters_.submitted;
  return ref;
}

bool TaskTable::admit(const std::string& id, CompletionKind kind, uint64_t now_ns,
                      uint32_t session) {
  if (draining_) {
    complete_unknown(id, kind, CompletionStatus::ERROR,
                     fmt::format("'{}' refused: the instance is draining (shutting down)", id),
                     now_ns, session);
    return false;
  }
  if (by_handle_.size() >= options_.max_live_requests) {
    complete_unknown(id, kind, CompletionStatus::ERROR,
                     fmt::format("'{}' refused: {} requests are in flight, the most this instance "
                                 "takes; resubmit once some have completed",
                                 id, by_handle_.size()),
                     now_ns, session);
    return false;
  }
  // Every request needs a tombstone when it ends: keep room for all of them.
  if (tombstones_.size() + by_handle_.size() >= tombstones_.limit()) {
    tombstones_.sweep(now_ns, tombstones_.capacity());
    if (tombstones_.size() + by_handle_.size() >= tombstones_.limit()) {
      complete_unknown(
          id, kind, CompletionStatus::ERROR,
          fmt::format("'{}' refused: this instance remembers {} recently completed "
                      "request ids, the most it can (each for its deadline plus "
                      "{} s); resubmit once they expire",
                      id, tombstones_.size(), options_.tombstone_margin_ns / 1'000'000'000),
          now_ns, session);
      return false;
    }
  }
  return true;
}

// A half for an id that is not live but recently ended. If this half is its
// partner, absorb it; if that half was already seen, it is a duplicate.
void TaskTable::absorb_or_reject_half(const std::string& id, Half half, Tombstones::Halves seen,
                                      const char* what, uint64_t now_ns, uint32_t session) {
  const bool dup = half == Half::kTask ? seen.task : seen.dest;
  if (dup) {
    complete_unknown(id, CompletionKind::CACHE, CompletionStatus::REJECTED,
                     fmt::format("{} '{}': duplicate; this request id already completed", what, id),
                     now_ns, session);
    return;
  }
  (half == Half::kTask ? seen.task : seen.dest) = true;
  tombstones_.mark(id, seen);
  ++counters_.absorbed;
  spdlog::info("{} '{}' arrived after its request had completed; absorbed", what, id);
}

void TaskTable::on_cache_task(schema::CacheTask::Reader shared, uint64_t now_ns, uint32_t session) {
  auto owned = copy_of(shared);  // validate our copy, never the shared bytes
  const auto task = owned->getRoot<schema::CacheTask>().asReader();
  if (Status s = messages::validate_request_id("CacheTask", task.getRequestId()); !s) {
    complete_unknown(printable_id(task.getRequestId()), CompletionKind::CACHE,
                     CompletionStatus::REJECTED, s.error().message, now_ns, session);
    return;
  }
  const std::string id = text(task.getRequestId());
  Request* live = find_live(id);
  if (live != nullptr && (live->kind != CompletionKind::CACHE || live->task)) {
    complete_unknown(id, CompletionKind::CACHE, CompletionStatus::REJECTED,
                     fmt::format("CacheTask '{}': duplicate; a request with this id is in flight "
                                 "(this one was dropped, the first continues)",
                                 id),
                     now_ns, session);
    return;
  }
  if (live == nullptr) {
    if (auto seen = tombstones_.find(id, now_ns)) {
      absorb_or_reject_half(id, Half::kTask, *seen, "CacheTask", now_ns, session);
      return;
    }
    if (!admit(id, CompletionKind::CACHE, now_ns, session)) return;
  }
  if (Status s = messages::validate(task, limits_); !s) {
    if (live != nullptr) {
      live->task = std::move(owned);
      finish(*live, CompletionStatus::ERROR, -1, s.error().message, now_ns);
    } else {
      complete_unknown(id, CompletionKind::CACHE, CompletionStatus::ERROR, s.error().message,
                       now_ns, session);
      remember(id, Tombstones::Halves{true, false}, 0, now_ns);
    }
    return;
  }
  Request& r = live != nullptr
                   ? *live
                   : create(id, CompletionKind::CACHE, now_ns, task.getDeadlineMs(), session);
  if (live != nullptr &&
      task.getDeadlineMs() != 0) {  // the task's own deadline, from first arrival
    deadlines_.erase(r.timer);
    r.deadline_ns = r.submitted_ns + uint64_t{task.getDeadlineMs()} * 1'000'000ULL;
    r.timer = deadlines_.emplace(r.deadline_ns, r.handle);
  }
  r.task = std::move(owned);
  spdlog::debug("CacheTask '{}' (handle {}) bound on every rank", id, r.handle);
  const bool sent = send_to_ranks(
      r,
      [&](schema::WorkerTask::Builder w) {
        w.setBind(r.task->getRoot<schema::CacheTask>().asReader());
      },
      now_ns);
  if (!sent) return;
  r.task_bound = true;
  maybe_dispatch_dest(r, now_ns);
}

// The destination of an ipc transfer must be another instance that accepts
// transfers (decode), and device_ids must name its ranks, each once.
std::optional<std::string> TaskTable::check_peer(schema::CacheDest::Reader dest,
                                                 std::optional<uint32_t>& peer_blocks) {
  if (dest.getProtocol() != schema::TransferProtocol::IPC) return std::nullopt;
  const std::string id = printable_id(dest.getRequestId());
  const std::string peer = text(dest.getPeerInstance());
  if (!options_.own_instance.empty() && peer == options_.own_instance)
    return fmt::format(
        "CacheDest '{}': peer_instance '{}' is this instance itself; a transfer "
        "goes to another (decode) instance",
        id, peer);
  if (!options_.peer_info) return std::nullopt;
  const std::optional<PeerInfo> info = options_.peer_info(peer);
  if (!info) return std::nullopt;  // unknown here: the worker checks when it attaches
  if (info->role != Role::kDecode)
    return fmt::format(
        "CacheDest '{}': peer_instance '{}' has role {}; only a decode instance "
        "accepts transfers",
        id, peer, role_name(info->role));
  peer_blocks = info->num_blocks;
  const auto devices = dest.getDeviceIds();
  std::vector<bool> used(info->tp_size, false);
  for (uint32_t i = 0; i < devices.size(); ++i) {
    const uint32_t d = devices[i];
    if (d >= info->tp_size)
      return fmt::format(
          "CacheDest '{}': device_ids[{}] = {} is out of range: decode instance "
          "'{}' has {} ranks",
          id, i, d, peer, info->tp_size);
    if (used[d])
      return fmt::format(
          "CacheDest '{}': device_ids names decode rank {} twice; each rank's "
          "blocks go to a rank of their own",
          id, d);
    used[d] = true;
  }
  return std::nullopt;
}

void TaskTable::on_cache_dest(schema::CacheDest::Reader shared, uint64_t now_ns, uint32_t session) {
  auto owned = copy_of(shared);
  const auto dest = owned->getRoot<schema::CacheDest>().asReader();
  if (Status s = messages::validate_request_id("CacheDest", dest.getRequestId()); !s) {
    complete_unknown(printable_id(dest.getRequestId()), CompletionKind::CACHE,
                     CompletionStatus::REJECTED, s.error().message, now_ns, session);
    return;
  }
  const std::string id = text(dest.getRequestId());
  Request* live = find_live(id);
  if (live != nullptr && (live->kind != CompletionKind::CACHE || live->dest)) {
    complete_unknown(id, CompletionKind::CACHE, CompletionStatus::REJECTED,
                     fmt::format("CacheDest '{}': duplicate; a request with this id is in flight "
                                 "(this one was dropped, the first continues)",
                                 id),
                     now_ns, session);
    return;
  }
  if (live == nullptr) {
    if (auto seen = tombstones_.find(id, now_ns)) {
      absorb_or_reject_half(id, Half::kDest, *seen, "CacheDest", now_ns, session);
      return;
    }
    if (!admit(id, CompletionKind::CACHE, now_ns, session)) return;
  }

  std::string error;
  std::optional<uint32_t> peer_blocks;
  if (dest.getErrorMessage().size() > 0) {
    error = fmt::format("CacheDest '{}': the decode side refused: {}", id,
                        printable(text(dest.getErrorMessage()), kMaxEchoedTextBytes));
  } else if (Status s = messages::validate(dest, limits_); !s) {
    error = s.error().message;
  } else if (auto why = check_peer(dest, peer_blocks)) {
    error = *why;
  } else if (peer_blocks) {
    if (Status p = messages::validate(dest, limits_, peer_blocks); !p) error = p.error().message;
  }
  if (!error.empty()) {
    if (live != nullptr) {
      live->dest = std::move(owned);
      finish(*live, CompletionStatus::ERROR, -1, error, now_ns);
    } else {
      complete_unknown(id, CompletionKind::CACHE, CompletionStatus::ERROR, error, now_ns, session);
      remember(id, Tombstones::Halves{false, true}, 0, now_ns);
    }
    return;
  }
  Request& r = live != nullptr ? *live : create(id, CompletionKind::CACHE, now_ns, 0, session);
  r.dest = std::move(owned);
  maybe_dispatch_dest(r, now_ns);
}

void TaskTable::maybe_dispatch_dest(Request& r, uint64_t now_ns) {
  if (!r.task || !r.dest || r.dest_sent || r.ending) return;
  const auto task = r.task->getRoot<schema::CacheTask>().asReader();
  const auto dest = r.dest->getRoot<schema::CacheDest>().asReader();
  if (Status s = messages::validate_pair(task, dest); !s) {
    finish(r, CompletionStatus::ERROR, -1, s.error().message, now_ns);
    return;
  }
  if (!send_to_ranks(
          r, [&](schema::WorkerTask::Builder w) { w.setDest(dest); }, now_ns))
    return;
  r.dest_sent = true;
}

void TaskTable::on_swap(schema::SwapTask::Reader shared, uint64_t now_ns, uint32_t session) {
  auto owned = copy_of(shared);
  const auto swap = owned->getRoot<schema::SwapTask>().asReader();
  if (Status s = messages::validate_request_id("SwapTask", swap.getRequestId()); !s) {
    complete_unknown(printable_id(swap.getRequestId()), CompletionKind::SWAP,
                     CompletionStatus::REJECTED, s.error().message, now_ns, session);
    return;
  }
  const std::string id = text(swap.getRequestId());
  if (find_live(id) != nullptr || tombstones_.find(id, now_ns)) {
    complete_unknown(id, CompletionKind::SWAP, CompletionStatus::REJECTED,
                     fmt::format("SwapTask '{}': duplicate request id", id), now_ns, session);
    return;
  }
  if (!admit(id, CompletionKind::SWAP, now_ns, session)) return;
  if (Status s = messages::validate(swap, limits_); !s) {
    complete_unknown(id, CompletionKind::SWAP, CompletionStatus::ERROR, s.error().message, now_ns,
                     session);
    remember(id, Tombstones::Halves{true, true}, 0, now_ns);
    return;
  }
  Request& r = create(id, CompletionKind::SWAP, now_ns, swap.getDeadlineMs(), session);
  if (swap.getDirection() == schema::SwapTask::Direction::LOAD) {
    const uint32_t first = swap.getFirstLayer();
    const uint32_t count =
        swap.getLayerCount() != 0 ? swap.getLayerCount() : limits_.total_layers() - first;
    r.progress_slot = sink_.begin_load_progress(r.handle, id, first, count, r.progress_generation);
  }
  send_to_ranks(
      r,
      [&](schema::WorkerTask::Builder w) {
        w.setSwap(swap);
        w.setProgressSlot(r.progress_slot);
        w.setProgressGeneration(r.progress_generation);
      },
      now_ns);
}

// The decode engine's word that a request's KV will arrive over tcp into
// these blocks: every rank tracks it, and its completion (kind arrived)
// comes when every rank has every byte.
void TaskTable::on_expect(schema::ExpectArrival::Reader shared, uint64_t now_ns, uint32_t session) {
  auto owned = copy_of(shared);
  const auto expect = owned->getRoot<schema::ExpectArrival>().asReader();
  if (Status s = messages::validate_request_id("ExpectArrival", expect.getRequestId()); !s) {
    complete_unknown(printable_id(expect.getRequestId()), CompletionKind::ARRIVED,
                     CompletionStatus::REJECTED, s.error().message, now_ns, session);
    return;
  }
  const std::string id = text(expect.getRequestId());
  if (find_live(id) != nullptr || tombstones_.find(id, now_ns)) {
    complete_unknown(id, CompletionKind::ARRIVED, CompletionStatus::REJECTED,
                     fmt::format("ExpectArrival '{}': duplicate request id", id), now_ns, session);
    return;
  }
  if (!admit(id, CompletionKind::ARRIVED, now_ns, session)) return;
  if (Status s = messages::validate(expect, limits_); !s) {
    complete_unknown(id, CompletionKind::ARRIVED, CompletionStatus::ERROR, s.error().message,
                     now_ns, session);
    remember(id, Tombstones::Halves{true, true}, 0, now_ns);
    return;
  }
  Request& r = create(id, CompletionKind::ARRIVED, now_ns, expect.getDeadlineMs(), session);
  send_to_ranks(
      r, [&](schema::WorkerTask::Builder w) { w.setExpect(expect); }, now_ns);
}

void TaskTable::on_connect(schema::ConnectTask::Reader shared, uint64_t now_ns, uint32_t session) {
  auto owned = copy_of(shared);
  const auto connect = owned->getRoot<schema::ConnectTask>().asReader();
  const std::string id = fmt::format("connect-{}", connect.getTaskId());
  if (find_live(id) != nullptr) {
    complete_unknown(id, CompletionKind::CONNECT, CompletionStatus::REJECTED,
                     fmt::format("ConnectTask {}: duplicate; one with this task id is in flight",
                                 connect.getTaskId()),
                     now_ns, session);
    return;
  }
  if (!admit(id, CompletionKind::CONNECT, now_ns, session)) return;
  if (Status s = messages::validate(connect, limits_); !s) {
    complete_unknown(id, CompletionKind::CONNECT, CompletionStatus::ERROR, s.error().message,
                     now_ns, session);
    return;
  }
  tombstones_.forget(id);  // connect ids may be reused once done
  Request& r = create(id, CompletionKind::CONNECT, now_ns, 0, session);
  send_to_ranks(
      r, [&](schema::WorkerTask::Builder w) { w.setConnect(connect); }, now_ns);
}

void TaskTable::on_register_pool(schema::RegisterPool::Reader shared, uint64_t now_ns,
                                 uint32_t session) {
  auto owned = copy_of(shared);
  const auto reg = owned->getRoot<schema::RegisterPool>().asReader();
  if (Status s = messages::validate(reg, limits_); !s) {
    complete_unknown("register-pool", CompletionKind::REGISTER_POOL, CompletionStatus::ERROR,
                     s.error().message, now_ns, session);
    return;
  }
  const auto pool = reg.getPool();
  const std::string id =
      fmt::format("register-pool-r{}-{}", pool.getRank(),
                  pool.getTier() == schema::PoolDescriptor::Tier::HOST ? "host" : "device");
  if (find_live(id) != nullptr) {
    complete_unknown(
        id, CompletionKind::REGISTER_POOL, CompletionStatus::REJECTED,
        fmt::format("RegisterPool for rank {}: one is already in flight", pool.getRank()), now_ns,
        session);
    return;
  }
  if (!admit(id, CompletionKind::REGISTER_POOL, now_ns, session)) return;
  if (auto why = down_reason(pool.getRank())) {
    complete_unknown(id, CompletionKind::REGISTER_POOL, CompletionStatus::ERROR, *why, now_ns,
                     session);
    return;
  }
  tombstones_.forget(id);
  Request& r = create(id, CompletionKind::REGISTER_POOL, now_ns, 0, session);
  // Only the pool's own rank takes part.
  r.ranks[pool.getRank()] = RankState::kPending;
  capnp::MallocMessageBuilder msg(256);
  auto w = msg.initRoot<schema::WorkerTask>();
  w.setHandle(r.handle);
  w.setRequestId(id);
  w.setRegisterPool(pool);
  sink_.to_worker(pool.getRank(), msg);
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
  if (r->ending) return;  // already being withdrawn; its one completion follows
  // Withdrawn from every rank like any other end: its completion waits for
  // the ranks that may still write (at once when nothing was sent yet), and
  // a rank that does not confirm in time is stopped.
  finish(*r, CompletionStatus::CANCELLED, -1,
         r->kind == CompletionKind::CACHE && !r->dest_sent
             ? "cancelled before both halves had arrived"
             : "cancelled",
         now_ns);
}

void TaskTable::on_malformed(const std::string& what, const std::string& error, uint64_t now_ns,
                             uint32_t session) {
  complete_unknown("", CompletionKind::OTHER, CompletionStatus::REJECTED,
                   fmt::format("{} record refused: {}", what, error), now_ns, session);
}

void TaskTable::on_report(const records::WorkerReport& report, uint64_t now_ns) {
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
  if (r.ending) {  // any answer means this rank stopped
    state = RankState::kCancelled;
    if (writers_settled(r)) emit(r, now_ns);
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
    finish(r, CompletionStatus::FINISHED, -1, "", now_ns);
  } else {
    finish(r, CompletionStatus::CANCELLED, -1, "cancelled", now_ns);
  }
}

void TaskTable::on_rank_lost(uint32_t rank, const std::string& reason, uint64_t now_ns) {
  if (rank < down_.size()) down_[rank] = reason;
  std::vector<uint64_t> hit;
  for (auto& [handle, r] : by_handle_) {
    if (rank < r->ranks.size() && r->ranks[rank] == RankState::kPending) hit.push_back(handle);
  }
  for (uint64_t handle : hit) {
    auto it = by_handle_.find(handle);
    if (it == by_handle_.end()) continue;
    Request& r = *it->second;
    r.ranks[rank] = RankState::kFailed;  // a dead rank writes nothing more
    if (r.ending) {
      if (writers_settled(r)) emit(r, now_ns);
      continue;
    }
    finish(r, CompletionStatus::ERROR, static_cast<int32_t>(rank),
           fmt::format("rank {} died ({}) while the request was in flight", rank, reason), now_ns);
  }
}

void TaskTable::on_session_ended(uint32_t session, uint64_t now_ns) {
  std::vector<uint64_t> hit;
  for (auto& [handle, r] : by_handle_)
    if (r->session == session && !r->silent) hit.push_back(handle);
  for (uint64_t handle : hit) {
    auto it = by_handle_.find(handle);
    if (it == by_handle_.end()) continue;
    Request& r = *it->second;
    r.silent = true;
    if (r.owns_id) {
      by_id_.erase(r.id);
      r.owns_id = false;
    }
    ++counters_.session_withdrawals;
    if (!r.ending) finish(r, CompletionStatus::CANCELLED, -1, "its engine session ended", now_ns);
  }
  if (!hit.empty())
    spdlog::info("engine session {:08x} ended: withdrew its {} requests", session, hit.size());
}

bool TaskTable::session_has_requests(uint32_t session) const {
  return std::any_of(by_handle_.begin(), by_handle_.end(),
                     [&](const auto& e) { return e.second->session == session; });
}

uint64_t TaskTable::tick(uint64_t now_ns) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now_ns) {
    const uint64_t handle = deadlines_.begin()->second;
    auto it = by_handle_.find(handle);
    if (it == by_handle_.end()) {
      deadlines_.erase(deadlines_.begin());
      continue;
    }
    Request& r = *it->second;
    if (!r.ending) {
      const uint64_t ms = (r.deadline_ns - r.submitted_ns) / 1'000'000ULL;
      finish(r, CompletionStatus::TIMEOUT, -1,
             fmt::format("'{}' passed its {} ms deadline while {}", r.id, ms, r.waiting_for()),
             now_ns);
      continue;
    }
    // Ranks that have not confirmed the withdrawal in time.
    std::string unconfirmed;
    bool awaiting_exits = false;
    for (uint32_t rank = 0; rank < r.ranks.size(); ++rank) {
      if (r.ranks[rank] != RankState::kPending) continue;
      unconfirmed += fmt::format("{}{}", unconfirmed.empty() ? "" : ", ", rank);
      if (r.withdraw_round == 0 &&
          sink_.rank_unresponsive(rank,
                                  fmt::format("did not confirm withdrawing '{}' in time", r.id))) {
        awaiting_exits = true;  // killed: its exit settles it (on_rank_lost)
      } else {
        r.ranks[rank] = RankState::kFailed;
        r.blocks_reusable = false;
      }
    }
    if (awaiting_exits) {
      r.withdraw_round = 1;
      arm_withdraw_deadline(r, now_ns + options_.withdraw_timeout_ns);
      continue;
    }
    r.end_message += fmt::format(
        " (rank {} did not confirm it stopped writing in time{}: do not reuse the destination "
        "blocks until it is known to have stopped)",
        unconfirmed, r.withdraw_round == 1 ? ", and its exit was not confirmed in time" : "");
    emit(r, now_ns);
  }
  tombstones_.sweep(now_ns, 4096);
  return deadlines_.empty() ? UINT64_MAX : deadlines_.begin()->first;
}

void TaskTable::fail_all(const std::string& reason, uint64_t now_ns) {
  std::vector<uint64_t> all;
  for (auto& [handle, r] : by_handle_)
    all.push_back(handle);
  for (uint64_t handle : all) {
    auto it = by_handle_.find(handle);
    if (it == by_handle_.end()) continue;
    Request& r = *it->second;
    // The instance is going away with its workers: nothing to wait for.
    for (RankState& st : r.ranks)
      if (st == RankState::kPending) st = RankState::kCancelled;
    if (!r.ending) {
      r.ending = true;
      r.end_status = CompletionStatus::ERROR;
      r.end_message = reason;
    }
    emit(r, now_ns);
  }
}

std::optional<std::string> TaskTable::down_reason(uint32_t rank) const {
  if (rank >= down_.size() || !down_[rank]) return std::nullopt;
  return fmt::format(
      "rank {} is down ({}) and not yet restarted; nothing was started, resubmit "
      "once the instance is ready again",
      rank, *down_[rank]);
}

bool TaskTable::send_to_ranks(Request& r,
                              const std::function<void(schema::WorkerTask::Builder)>& fill,
                              uint64_t now_ns) {
  for (uint32_t rank = 0; rank < limits_.tp_size; ++rank) {
    if (auto why = down_reason(rank)) {
      finish(r, CompletionStatus::ERROR, static_cast<int32_t>(rank),
             fmt::format("'{}': {}", r.id, *why), now_ns);
      return false;
    }
  }
  // Encoded once: every rank gets the same task.
  capnp::MallocMessageBuilder msg(512);
  auto w = msg.initRoot<schema::WorkerTask>();
  w.setHandle(r.handle);
  w.setRequestId(r.id);
  fill(w);
  for (uint32_t rank = 0; rank < limits_.tp_size; ++rank) {
    sink_.to_worker(rank, msg);
    r.ranks[rank] = RankState::kPending;
  }
  return true;
}

void TaskTable::send_cancel(Request& r) {
  capnp::MallocMessageBuilder msg(64);
  auto w = msg.initRoot<schema::WorkerTask>();
  w.setHandle(r.handle);
  w.setRequestId(r.id);
  w.setCancel();
  for (uint32_t rank = 0; rank < r.ranks.size(); ++rank) {
    if (r.ranks[rank] == RankState::kPending) sink_.to_worker(rank, msg);
  }
}

void TaskTable::finish(Request& r, CompletionStatus status, int32_t error_rank,
                       const std::string& message, uint64_t now_ns) {
  r.ending = true;
  r.end_status = status;
  r.end_rank = error_rank;
  r.end_message = message;
  if (status == CompletionStatus::FINISHED) {
    emit(r, now_ns);
    return;
  }
  send_cancel(r);  // withdraw it wherever it still runs
  if (writers_settled(r)) {
    emit(r, now_ns);
    return;
  }
  // Wait for the writers' confirmations, but not forever.
  arm_withdraw_deadline(r, now_ns + options_.withdraw_timeout_ns);
}

void TaskTable::arm_withdraw_deadline(Request& r, uint64_t at_ns) {
  deadlines_.erase(r.timer);
  r.timer = deadlines_.emplace(at_ns, r.handle);
}

bool TaskTable::writers_settled(const Request& r) const {
  if (!r.can_write()) return true;
  return std::none_of(r.ranks.begin(), r.ranks.end(),
                      [](RankState st) { return st == RankState::kPending; });
}

void TaskTable::emit(Request& r, uint64_t now_ns) {
  if (r.progress_slot != Sink::kNoProgressSlot)
    sink_.end_load_progress(r.progress_slot, r.end_status == CompletionStatus::FINISHED);
  if (!r.silent) {
    capnp::MallocMessageBuilder msg(256);
    auto c = msg.initRoot<schema::Completion>();
    c.setRequestId(r.id);
    c.setKind(r.kind);
    c.setStatus(r.end_status);
    c.setErrorRank(r.end_rank);
    c.setMessage(printable(r.end_message, kMaxCompletionMessageBytes));
    c.setBytesMoved(r.bytes);
    c.setSubmittedNs(r.submitted_ns);
    c.setCompletedNs(now_ns);
    c.setFirstCopyNs(r.first_copy_ns);
    c.setSession(r.session);
    c.setBlocksReusable(r.blocks_reusable);
    // Counted first: whoever reads the completion may look at the counters next.
    switch (r.end_status) {
      case CompletionStatus::FINISHED: ++counters_.finished; break;
      case CompletionStatus::ERROR: ++counters_.errors; break;
      case CompletionStatus::CANCELLED: ++counters_.cancelled; break;
      case CompletionStatus::TIMEOUT: ++counters_.timeouts; break;
      case CompletionStatus::REJECTED: ++counters_.rejected; break;
    }
    sink_.complete(msg);
    if (r.end_status != CompletionStatus::FINISHED)
      spdlog::info("'{}' {}: {}", r.id,
                   r.end_status == CompletionStatus::ERROR ? "failed" : "ended", r.end_message);
  }
  if (r.owns_id) {
    const bool single = r.kind != CompletionKind::CACHE;
    remember(r.id, Tombstones::Halves{single || r.task != nullptr, single || r.dest != nullptr},
             r.deadline_ns - r.submitted_ns, now_ns);
    by_id_.erase(r.id);
  }
  deadlines_.erase(r.timer);
  by_handle_.erase(r.handle);  // destroys r
}

void TaskTable::complete_unknown(const std::string& id, CompletionKind kind,
                                 CompletionStatus status, const std::string& message,
                                 uint64_t now_ns, uint32_t session) {
  capnp::MallocMessageBuilder msg(256);
  auto c = msg.initRoot<schema::Completion>();
  c.setRequestId(id);
  c.setKind(kind);
  c.setStatus(status);
  c.setErrorRank(-1);
  c.setMessage(printable(message, kMaxCompletionMessageBytes));
  c.setSubmittedNs(now_ns);
  c.setCompletedNs(now_ns);
  c.setSession(session);
  c.setBlocksReusable(true);  // nothing was started for it
  ++(status == CompletionStatus::REJECTED ? counters_.rejected : counters_.errors);
  sink_.complete(msg);
  if (status == CompletionStatus::REJECTED) {
    spdlog::debug("rejected: {}", message);  // the live request of that id is not affected
  } else {
    spdlog::info("{}", message);
  }
}

// `deadline_ns`: how long the request had (its partner may come that long
// after its first half).
void TaskTable::remember(const std::string& id, Tombstones::Halves halves, uint64_t deadline_ns,
                         uint64_t now_ns) {
  const uint64_t lifetime =
      std::max(deadline_ns, options_.default_deadline_ns) + options_.tombstone_margin_ns;
  if (!tombstones_.remember(id, halves, now_ns + lifetime, now_ns))
    spdlog::error(
        "could not remember completed id '{}': {} ids remembered, the most this "
        "instance holds",
        id, tombstones_.size());
}

}  // namespace kvrelay::coordinator
