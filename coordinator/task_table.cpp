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

// A request id as it may be shown back: printable ASCII, the rest escaped.
std::string printable_id(capnp::Text::Reader id) {
  std::string out;
  const auto* b = reinterpret_cast<const unsigned char*>(id.cStr());
  for (size_t i = 0; i < id.size() && out.size() < messages::kMaxRequestIdBytes; ++i) {
    if (b[i] > 0x20 && b[i] < 0x7f) {
      out.push_back(static_cast<char>(b[i]));
    } else {
      out += fmt::format("\\x{:02x}", b[i]);
    }
  }
  return out;
}

std::string text(capnp::Text::Reader t) {
  return std::string(t.cStr(), t.size());
}

uint64_t deadline_after(uint64_t now_ns, uint32_t deadline_ms, uint64_t default_ns) {
  return now_ns + (deadline_ms != 0 ? uint64_t{deadline_ms} * 1'000'000ULL : default_ns);
}

}  // namespace

struct TaskTable::Request {
  std::string id;
  uint64_t handle = 0;
  CompletionKind kind = CompletionKind::CACHE;
  uint64_t submitted_ns = 0;
  uint64_t deadline_ns = 0;
  std::multimap<uint64_t, uint64_t>::iterator deadline_entry;
  std::unique_ptr<capnp::MallocMessageBuilder> task;  // CacheTask
  std::unique_ptr<capnp::MallocMessageBuilder> dest;  // CacheDest
  bool task_bound = false;
  bool dest_sent = false;
  bool cancelling = false;
  std::vector<RankState> ranks;
  uint64_t bytes = 0;
  uint64_t first_copy_ns = 0;                      // the earliest rank's first copy (0: none yet)
  uint32_t progress_slot = Sink::kNoProgressSlot;  // swap loads: per-layer progress
  // Set once the outcome is decided; the completion waits for the writers.
  bool ending = false;
  CompletionStatus end_status = CompletionStatus::FINISHED;
  int32_t end_rank = -1;
  std::string end_message;
  // Whether the ranks may write into pools for it (a decode half was
  // dispatched, or it is a swap): then its end waits for them.
  bool can_write() const {
    return kind == CompletionKind::SWAP || (kind == CompletionKind::CACHE && dest_sent);
  }
  std::string waiting_for() const {
    if (kind != CompletionKind::CACHE || dest_sent) return "the ranks were still working";
    return task ? "waiting for its CacheDest" : "waiting for its CacheTask";
  }
};

TaskTable::TaskTable(const messages::Limits& limits, TableOptions options, Sink& sink)
    : limits_(limits), options_(std::move(options)), sink_(sink), down_(limits.tp_size) {}

TaskTable::~TaskTable() = default;

TaskTable::Request* TaskTable::find_live(const std::string& id) {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

TaskTable::Request& TaskTable::create(const std::string& id, CompletionKind kind, uint64_t now_ns,
                                      uint32_t deadline_ms) {
  auto r = std::make_unique<Request>();
  r->id = id;
  r->handle = next_handle_++;
  r->kind = kind;
  r->submitted_ns = now_ns;
  r->deadline_ns = deadline_after(now_ns, deadline_ms, options_.default_deadline_ns);
  r->ranks.assign(limits_.tp_size, RankState::kIdle);
  r->deadline_entry = deadlines_.emplace(r->deadline_ns, r->handle);
  Request& ref = *r;
  by_id_[id] = &ref;
  by_handle_[ref.handle] = std::move(r);
  ++counters_.submitted;
  return ref;
}

bool TaskTable::refuse_if_draining(const std::string& id, CompletionKind kind, uint64_t now_ns) {
  if (!draining_) return false;
  complete_unknown(id, kind, CompletionStatus::ERROR,
                   fmt::format("'{}' refused: the instance is draining (shutting down)", id),
                   now_ns);
  return true;
}

// A half for an id that is not live. If the id recently ended and this half
// is its partner, absorb it; if that half was already seen, it is a duplicate.
void TaskTable::absorb_or_reject_half(const std::string& id, Half half, const char* what,
                                      uint64_t now_ns) {
  auto t = tombstones_.find(id);
  const bool seen = half == Half::kTask ? t->second.task_seen : t->second.dest_seen;
  if (seen) {
    complete_unknown(id, CompletionKind::CACHE, CompletionStatus::REJECTED,
                     fmt::format("{} '{}': duplicate; this request id already completed", what, id),
                     now_ns);
    return;
  }
  (half == Half::kTask ? t->second.task_seen : t->second.dest_seen) = true;
  ++counters_.absorbed;
  spdlog::info("{} '{}' arrived after its request had completed; absorbed", what, id);
}

void TaskTable::on_cache_task(schema::CacheTask::Reader shared, uint64_t now_ns) {
  auto owned = copy_of(shared);  // validate our copy, never the shared bytes
  const auto task = owned->getRoot<schema::CacheTask>().asReader();
  if (Status s = messages::validate_request_id("CacheTask", task.getRequestId()); !s) {
    complete_unknown(printable_id(task.getRequestId()), CompletionKind::CACHE,
                     CompletionStatus::REJECTED, s.error().message, now_ns);
    return;
  }
  const std::string id = text(task.getRequestId());
  Request* live = find_live(id);
  if (live != nullptr && (live->kind != CompletionKind::CACHE || live->task)) {
    complete_unknown(id, CompletionKind::CACHE, CompletionStatus::REJECTED,
                     fmt::format("CacheTask '{}': duplicate; a request with this id is in flight "
                                 "(this one was dropped, the first continues)",
                                 id),
                     now_ns);
    return;
  }
  if (live == nullptr && tombstones_.count(id) != 0) {
    absorb_or_reject_half(id, Half::kTask, "CacheTask", now_ns);
    return;
  }
  if (live == nullptr && refuse_if_draining(id, CompletionKind::CACHE, now_ns)) return;
  if (Status s = messages::validate(task, limits_); !s) {
    if (live != nullptr) {
      live->task = std::move(owned);
      finish(*live, CompletionStatus::ERROR, -1, s.error().message, now_ns);
    } else {
      complete_unknown(id, CompletionKind::CACHE, CompletionStatus::ERROR, s.error().message,
                       now_ns);
      remember(id, true, false, now_ns);
    }
    return;
  }
  Request& r =
      live != nullptr ? *live : create(id, CompletionKind::CACHE, now_ns, task.getDeadlineMs());
  if (live != nullptr &&
      task.getDeadlineMs() != 0) {  // the task's own deadline, from first arrival
    deadlines_.erase(r.deadline_entry);
    r.deadline_ns = r.submitted_ns + uint64_t{task.getDeadlineMs()} * 1'000'000ULL;
    r.deadline_entry = deadlines_.emplace(r.deadline_ns, r.handle);
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

void TaskTable::on_cache_dest(schema::CacheDest::Reader shared, uint64_t now_ns) {
  auto owned = copy_of(shared);
  const auto dest = owned->getRoot<schema::CacheDest>().asReader();
  if (Status s = messages::validate_request_id("CacheDest", dest.getRequestId()); !s) {
    complete_unknown(printable_id(dest.getRequestId()), CompletionKind::CACHE,
                     CompletionStatus::REJECTED, s.error().message, now_ns);
    return;
  }
  const std::string id = text(dest.getRequestId());
  Request* live = find_live(id);
  if (live != nullptr && (live->kind != CompletionKind::CACHE || live->dest)) {
    complete_unknown(id, CompletionKind::CACHE, CompletionStatus::REJECTED,
                     fmt::format("CacheDest '{}': duplicate; a request with this id is in flight "
                                 "(this one was dropped, the first continues)",
                                 id),
                     now_ns);
    return;
  }
  if (live == nullptr && tombstones_.count(id) != 0) {
    absorb_or_reject_half(id, Half::kDest, "CacheDest", now_ns);
    return;
  }
  if (live == nullptr && refuse_if_draining(id, CompletionKind::CACHE, now_ns)) return;

  std::optional<uint32_t> peer_blocks;
  if (dest.getProtocol() == schema::TransferProtocol::IPC && options_.peer_blocks)
    peer_blocks = options_.peer_blocks(text(dest.getPeerInstance()));
  std::string error;
  if (dest.getErrorMessage().size() > 0) {
    error = fmt::format("CacheDest '{}': the decode side refused: {}", id,
                        text(dest.getErrorMessage()));
  } else if (Status s = messages::validate(dest, limits_, peer_blocks); !s) {
    error = s.error().message;
  }
  if (!error.empty()) {
    if (live != nullptr) {
      live->dest = std::move(owned);
      finish(*live, CompletionStatus::ERROR, -1, error, now_ns);
    } else {
      complete_unknown(id, CompletionKind::CACHE, CompletionStatus::ERROR, error, now_ns);
      remember(id, false, true, now_ns);
    }
    return;
  }
  Request& r = live != nullptr ? *live : create(id, CompletionKind::CACHE, now_ns, 0);
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

void TaskTable::on_swap(schema::SwapTask::Reader shared, uint64_t now_ns) {
  auto owned = copy_of(shared);
  const auto swap = owned->getRoot<schema::SwapTask>().asReader();
  if (Status s = messages::validate_request_id("SwapTask", swap.getRequestId()); !s) {
    complete_unknown(printable_id(swap.getRequestId()), CompletionKind::SWAP,
                     CompletionStatus::REJECTED, s.error().message, now_ns);
    return;
  }
  const std::string id = text(swap.getRequestId());
  if (find_live(id) != nullptr || tombstones_.count(id) != 0) {
    complete_unknown(id, CompletionKind::SWAP, CompletionStatus::REJECTED,
                     fmt::format("SwapTask '{}': duplicate request id", id), now_ns);
    return;
  }
  if (refuse_if_draining(id, CompletionKind::SWAP, now_ns)) return;
  if (Status s = messages::validate(swap, limits_); !s) {
    complete_unknown(id, CompletionKind::SWAP, CompletionStatus::ERROR, s.error().message, now_ns);
    remember(id, true, true, now_ns);
    return;
  }
  Request& r = create(id, CompletionKind::SWAP, now_ns, swap.getDeadlineMs());
  if (swap.getDirection() == schema::SwapTask::Direction::LOAD) {
    const uint32_t first = swap.getFirstLayer();
    const uint32_t count =
        swap.getLayerCount() != 0 ? swap.getLayerCount() : limits_.total_layers() - first;
    r.progress_slot = sink_.begin_load_progress(r.handle, id, first, count);
  }
  send_to_ranks(
      r,
      [&](schema::WorkerTask::Builder w) {
        w.setSwap(swap);
        w.setProgressSlot(r.progress_slot);
      },
      now_ns);
}

void TaskTable::on_connect(schema::ConnectTask::Reader shared, uint64_t now_ns) {
  auto owned = copy_of(shared);
  const auto connect = owned->getRoot<schema::ConnectTask>().asReader();
  const std::string id = fmt::format("connect-{}", connect.getTaskId());
  if (find_live(id) != nullptr) {
    complete_unknown(id, CompletionKind::CONNECT, CompletionStatus::REJECTED,
                     fmt::format("ConnectTask {}: duplicate; one with this task id is in flight",
                                 connect.getTaskId()),
                     now_ns);
    return;
  }
  if (refuse_if_draining(id, CompletionKind::CONNECT, now_ns)) return;
  if (Status s = messages::validate(connect, limits_); !s) {
    complete_unknown(id, CompletionKind::CONNECT, CompletionStatus::ERROR, s.error().message,
                     now_ns);
    return;
  }
  tombstones_.erase(id);  // connect ids may be reused once done
  Request& r = create(id, CompletionKind::CONNECT, now_ns, 0);
  send_to_ranks(
      r, [&](schema::WorkerTask::Builder w) { w.setConnect(connect); }, now_ns);
}

void TaskTable::on_register_pool(schema::RegisterPool::Reader shared, uint64_t now_ns) {
  auto owned = copy_of(shared);
  const auto reg = owned->getRoot<schema::RegisterPool>().asReader();
  if (Status s = messages::validate(reg, limits_); !s) {
    complete_unknown("register-pool", CompletionKind::REGISTER_POOL, CompletionStatus::ERROR,
                     s.error().message, now_ns);
    return;
  }
  const auto pool = reg.getPool();
  const std::string id =
      fmt::format("register-pool-r{}-{}", pool.getRank(),
                  pool.getTier() == schema::PoolDescriptor::Tier::HOST ? "host" : "device");
  if (find_live(id) != nullptr) {
    complete_unknown(
        id, CompletionKind::REGISTER_POOL, CompletionStatus::REJECTED,
        fmt::format("RegisterPool for rank {}: one is already in flight", pool.getRank()), now_ns);
    return;
  }
  if (refuse_if_draining(id, CompletionKind::REGISTER_POOL, now_ns)) return;
  if (auto why = down_reason(pool.getRank())) {
    complete_unknown(id, CompletionKind::REGISTER_POOL, CompletionStatus::ERROR, *why, now_ns);
    return;
  }
  tombstones_.erase(id);
  Request& r = create(id, CompletionKind::REGISTER_POOL, now_ns, 0);
  // Only the pool's own rank takes part.
  r.ranks[pool.getRank()] = RankState::kPending;
  capnp::MallocMessageBuilder msg(256);
  auto w = msg.initRoot<schema::WorkerTask>();
  w.setHandle(r.handle);
  w.setRequestId(id);
  w.setRegisterPool(pool);
  sink_.to_worker(pool.getRank(), msg);
}

void TaskTable::on_cancel(schema::Cancel::Reader shared, uint64_t now_ns) {
  const std::string id = printable_id(shared.getRequestId());
  if (Status s = messages::validate_request_id("Cancel", shared.getRequestId()); !s) {
    complete_unknown(id, CompletionKind::OTHER, CompletionStatus::REJECTED, s.error().message,
                     now_ns);
    return;
  }
  Request* r = find_live(id);
  if (r == nullptr) {
    complete_unknown(id, CompletionKind::OTHER, CompletionStatus::REJECTED,
                     tombstones_.count(id) != 0
                         ? fmt::format("Cancel '{}': the request already completed", id)
                         : fmt::format("Cancel '{}': no live request has this id", id),
                     now_ns);
    return;
  }
  if (r->kind == CompletionKind::CACHE && !r->dest_sent) {
    // Nothing is being sent yet: withdraw the bound half and end it now.
    finish(*r, CompletionStatus::CANCELLED, -1, "cancelled before both halves had arrived", now_ns);
    return;
  }
  if (!r->cancelling) {
    r->cancelling = true;
    send_cancel(*r);
  }
}

void TaskTable::on_malformed(const std::string& what, const std::string& error, uint64_t now_ns) {
  complete_unknown("", CompletionKind::OTHER, CompletionStatus::REJECTED,
                   fmt::format("{} record refused: {}", what, error), now_ns);
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
    if (static_cast<records::ReportKind>(report.kind) == records::ReportKind::kSwapLayerDone)
      return;
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
      const std::string why = fmt::format("rank {}: {}", report.rank, report.message_text());
      finish(r, r.cancelling ? CompletionStatus::CANCELLED : CompletionStatus::ERROR,
             static_cast<int32_t>(report.rank), why, now_ns);
      return;
    }
    case ReportKind::kSwapLayerDone: return;  // progress only
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

uint64_t TaskTable::tick(uint64_t now_ns) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now_ns) {
    const uint64_t handle = deadlines_.begin()->second;
    auto it = by_handle_.find(handle);
    if (it == by_handle_.end()) {
      deadlines_.erase(deadlines_.begin());
      continue;
    }
    Request& r = *it->second;
    if (r.ending) {
      // Ranks that have not confirmed the withdrawal in time: stop them, and
      // let the engine know the blocks were not confirmed free.
      std::string stuck;
      for (uint32_t rank = 0; rank < r.ranks.size(); ++rank) {
        if (r.ranks[rank] != RankState::kPending) continue;
        sink_.rank_unresponsive(rank,
                                fmt::format("did not confirm withdrawing '{}' in time", r.id));
        stuck += fmt::format("{}{}", stuck.empty() ? "" : ", ", rank);
        r.ranks[rank] = RankState::kFailed;
      }
      r.end_message += fmt::format(" (rank {} did not confirm it stopped writing in time)", stuck);
      emit(r, now_ns);
      continue;
    }
    const uint64_t ms = (r.deadline_ns - r.submitted_ns) / 1'000'000ULL;
    finish(r, CompletionStatus::TIMEOUT, -1,
           fmt::format("'{}' passed its {} ms deadline while {}", r.id, ms, r.waiting_for()),
           now_ns);
  }
  while (!tombstone_order_.empty() && tombstone_order_.front().first <= now_ns) {
    auto t = tombstones_.find(tombstone_order_.front().second);
    if (t != tombstones_.end() && t->second.expires_ns <= now_ns) tombstones_.erase(t);
    tombstone_order_.pop_front();
  }
  uint64_t next = UINT64_MAX;
  if (!deadlines_.empty()) next = deadlines_.begin()->first;
  if (!tombstone_order_.empty()) next = std::min(next, tombstone_order_.front().first);
  return next;
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
  for (uint32_t rank = 0; rank < limits_.tp_size; ++rank) {
    capnp::MallocMessageBuilder msg(512);
    auto w = msg.initRoot<schema::WorkerTask>();
    w.setHandle(r.handle);
    w.setRequestId(r.id);
    fill(w);
    sink_.to_worker(rank, msg);
    r.ranks[rank] = RankState::kPending;
  }
  return true;
}

void TaskTable::send_cancel(Request& r) {
  for (uint32_t rank = 0; rank < r.ranks.size(); ++rank) {
    if (r.ranks[rank] != RankState::kPending) continue;
    capnp::MallocMessageBuilder msg(64);
    auto w = msg.initRoot<schema::WorkerTask>();
    w.setHandle(r.handle);
    w.setRequestId(r.id);
    w.setCancel();
    sink_.to_worker(rank, msg);
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
  deadlines_.erase(r.deadline_entry);
  r.deadline_entry = deadlines_.emplace(now_ns + options_.withdraw_timeout_ns, r.handle);
}

bool TaskTable::writers_settled(const Request& r) const {
  if (!r.can_write()) return true;
  for (RankState st : r.ranks)
    if (st == RankState::kPending) return false;
  return true;
}

void TaskTable::emit(Request& r, uint64_t now_ns) {
  capnp::MallocMessageBuilder msg(256);
  auto c = msg.initRoot<schema::Completion>();
  c.setRequestId(r.id);
  c.setKind(r.kind);
  c.setStatus(r.end_status);
  c.setErrorRank(r.end_rank);
  c.setMessage(r.end_message);
  c.setBytesMoved(r.bytes);
  c.setSubmittedNs(r.submitted_ns);
  c.setCompletedNs(now_ns);
  c.setFirstCopyNs(r.first_copy_ns);
  if (r.progress_slot != Sink::kNoProgressSlot)
    sink_.end_load_progress(r.progress_slot, r.end_status == CompletionStatus::FINISHED);
  sink_.complete(msg);
  switch (r.end_status) {
    case CompletionStatus::FINISHED: ++counters_.finished; break;
    case CompletionStatus::ERROR: ++counters_.errors; break;
    case CompletionStatus::CANCELLED: ++counters_.cancelled; break;
    case CompletionStatus::TIMEOUT: ++counters_.timeouts; break;
    case CompletionStatus::REJECTED: ++counters_.rejected; break;
  }
  if (r.end_status != CompletionStatus::FINISHED)
    spdlog::info("'{}' {}: {}", r.id, r.end_status == CompletionStatus::ERROR ? "failed" : "ended",
                 r.end_message);
  remember(r.id, r.task != nullptr || r.kind != CompletionKind::CACHE,
           r.dest != nullptr || r.kind != CompletionKind::CACHE, now_ns);
  deadlines_.erase(r.deadline_entry);
  by_id_.erase(r.id);
  by_handle_.erase(r.handle);  // destroys r
}

void TaskTable::complete_unknown(const std::string& id, CompletionKind kind,
                                 CompletionStatus status, const std::string& message,
                                 uint64_t now_ns) {
  capnp::MallocMessageBuilder msg(256);
  auto c = msg.initRoot<schema::Completion>();
  c.setRequestId(id);
  c.setKind(kind);
  c.setStatus(status);
  c.setErrorRank(-1);
  c.setMessage(message);
  c.setSubmittedNs(now_ns);
  c.setCompletedNs(now_ns);
  sink_.complete(msg);
  if (status == CompletionStatus::REJECTED) {
    ++counters_.rejected;
    spdlog::info("rejected: {}", message);  // the live request of that id is not affected
  } else {
    ++counters_.errors;
    spdlog::warn("{}", message);
  }
}

void TaskTable::remember(const std::string& id, bool task_seen, bool dest_seen, uint64_t now_ns) {
  const uint64_t expires = now_ns + options_.tombstone_ns;
  tombstones_[id] = Tombstone{expires, task_seen, dest_seen};
  tombstone_order_.emplace_back(expires, id);
  while (tombstones_.size() > options_.max_tombstones && !tombstone_order_.empty()) {
    tombstones_.erase(tombstone_order_.front().second);
    tombstone_order_.pop_front();
  }
}

}  // namespace kvrelay::coordinator
