#include "worker/send_scheduler.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "schemas/codec.h"
#include "shm/clock.h"
#include "worker/request_key.h"

namespace kvrelay::worker {

using records::ReportKind;
using records::SignalKind;

namespace {

// The cause first: a report's message has a bounded length, and the peer's
// name (long instance names) must not push the cause out of it.
std::string transfer_failure(const std::string& cause, uint32_t layer, const Destination& dest) {
  return fmt::format("{} (layer {}, to {})", cause, layer, dest.peer());
}

}  // namespace

struct SendScheduler::Request {
  uint64_t handle = 0;
  std::string id;
  std::vector<uint32_t> src;
  uint64_t need_tokens = 0;
  bool legacy = false;
  uint64_t legacy_step = 0;
  uint32_t slot = 0;
  uint32_t tag = 0;
  // Its chunks came in batches that carry its tag: signals find it by tag,
  // whatever else is bound to its slot (on_bind).
  bool tagged = false;
  bool owns_slot = false;
  Progress progress;
  bool has_dest = false;
  std::vector<uint32_t> dst;
  uint32_t prefix = 0;  // blocks the decode side already holds
  std::shared_ptr<Destination> destination;
  std::vector<uint32_t> sent;  // per layer: blocks [0, sent[l]) are handed to the transport
  uint64_t serial = 0;         // tells this binding of the handle from an earlier one
  uint64_t key = 0;            // request_key(id, its dest's nonce): names it to a receiver
  uint32_t dst_block_end = 0;  // one past its largest destination block
  uint32_t in_flight = 0;      // transfers handed to the transport and not completed
  // Ended (failed, cancelled) with transfers in flight: reported when they complete.
  bool ending = false;
  records::ReportKind end_kind = records::ReportKind::kFailed;
  std::string end_message;
  uint64_t bytes = 0;
  uint64_t first_copy_ns = 0;  // when its first copy began (dispatch latency, Completion)
  uint64_t done_ns = 0;        // when its latest copy was seen done
  // When the engine pushed the signal that let its latest layer go (0: not
  // a stamped signal, e.g. a late destination): the tail is timed from it.
  uint64_t released_by_push_ns = 0;
  // The watchdog's clocks: when every layer of its final chunk was signalled
  // here, and when it ended with transfers in flight (0: not yet).
  uint64_t prefilled_ns = 0;
  uint64_t ending_ns = 0;
  bool stall_listed = false;  // find_stalls() has listed it
};

SendScheduler::SendScheduler(uint32_t rank, const PoolGeometry& local, Transport& transport,
                             Reporter reporter)
    : rank_(rank),
      local_(local),
      layers_(local.total_layers()),
      transport_(transport),
      report_(std::move(reporter)),
      slots_(kMaxSlots) {}

SendScheduler::~SendScheduler() = default;

void SendScheduler::on_bind(uint64_t handle, schema::CacheTask::Reader task,
                            std::optional<uint64_t> watermark) {
  if (requests_.count(handle) != 0) return;  // already bound (a repeated dispatch)
  auto r = std::make_unique<Request>();
  r->handle = handle;
  r->serial = ++request_serial_;
  r->id = task.getRequestId().cStr();
  r->key = request_key(r->id);
  r->src = messages::to_vector(task.getSrcBlockIds());
  r->need_tokens = task.getNeedPrefillTokens();
  r->progress.tokens.assign(layers_, 0);
  Request& req = *r;
  requests_[handle] = std::move(r);
  spdlog::debug("bind '{}' (handle {}): {} blocks, {} tokens, {}", req.id, handle, req.src.size(),
                req.need_tokens,
                task.isLegacyPrefillStep()
                    ? fmt::format("legacy step {}", task.getLegacyPrefillStep())
                    : fmt::format("slot {}", task.getEngineSlot()));

  if (task.isLegacyPrefillStep()) {
    req.legacy = true;
    req.legacy_step = task.getLegacyPrefillStep();
    legacy_requests_.push_back(handle);
    return;
  }
  req.slot = task.getEngineSlot();
  req.tag = records::request_tag(req.id);
  if (req.slot >= kMaxSlots) {
    end(req, ReportKind::kFailed, fmt::format("engine slot {} out of range", req.slot));
    return;
  }
  Slot& slot = slots_[req.slot];
  adopt_pending(req, slot, watermark);
  note_prefill_progress(req, mono_now_ns());
  if (lost_final_chunk(req, slot, watermark)) {
    end(req, ReportKind::kFailed,
        fmt::format("its final chunk (engine slot {}, step {}, {} tokens) was signalled without "
                    "a request tag before its CacheTask reached rank {}, and could not be told "
                    "apart from an earlier request's signals on that slot; push batches through "
                    "a kvrelay client after submitting the CacheTask, or tag them "
                    "(BatchSlot::request_tag)",
                    req.slot, slot.unowned_final.step, slot.unowned_final.tokens, rank_));
    return;
  }
  // An untagged engine gives no other way to see that the slot moved on. A
  // tagged request stays bound: the bind comes from the engine's scheduler,
  // and may overtake the last layers that another rank's model runner
  // pushes for it; they find it by its tag, and this rank's own next batch
  // for the slot says whether the slot moved on before its prefill completed
  // (on_batch_entry).
  for (uint64_t h : std::vector<uint64_t>(slot.bound)) {
    auto prev = requests_.find(h);
    if (prev == requests_.end()) continue;
    if (prefill_complete(*prev->second)) {
      unbind(*prev->second);
    } else if (prev->second->tag != req.tag && !prev->second->tagged) {
      end(*prev->second, ReportKind::kFailed,
          fmt::format("engine slot {} was given to request '{}' before this request's prefill "
                      "completed",
                      req.slot, req.id));
    }
  }
  slot.bound.push_back(handle);
  req.owns_slot = true;
  release_slot_if_done(req);
}

// Adopts the signals that came before the task: the pending session with
// this request's tag, else an untagged one pushed after the task was
// submitted (never one from before: that belongs to an earlier request).
// Untagged sessions older than the watermark can belong to no request bound
// from now on, and are dropped.
void SendScheduler::adopt_pending(Request& req, Slot& slot, std::optional<uint64_t> watermark) {
  auto it = std::find_if(slot.pending.begin(), slot.pending.end(),
                         [&](const Session& s) { return s.tag == req.tag; });
  if (it == slot.pending.end())
    it = std::find_if(slot.pending.begin(), slot.pending.end(), [&](const Session& s) {
      return s.tag == 0 && (!watermark || s.first_index >= *watermark);
    });
  if (it != slot.pending.end()) {
    req.tagged = it->tag != 0;
    req.progress = std::move(it->progress);
    slot.pending.erase(it);
    --pending_sessions_;
  }
  if (!watermark) return;
  const size_t before = slot.pending.size();
  std::erase_if(slot.pending,
                [&](const Session& s) { return s.tag == 0 && s.last_index < *watermark; });
  const size_t stale = before - slot.pending.size();
  pending_sessions_ -= stale;
  counters_.stale_sessions += stale;
}

// The request's final chunk was signalled here after its submission, with
// no tag and before its bind, yet the request did not adopt it: it went into
// an untagged session that began before the watermark (an ended request's
// leftover signals). Without its final chunk the request could never finish.
bool SendScheduler::lost_final_chunk(const Request& req, const Slot& slot,
                                     std::optional<uint64_t> watermark) const {
  const UnownedChunk& c = slot.unowned_final;
  return c.seen && !prefill_complete(req) && c.tokens >= req.need_tokens &&
         (!watermark || c.index >= *watermark);
}

void SendScheduler::note_prefill_progress(Request& r, uint64_t now_ns) {
  if (r.prefilled_ns == 0 && prefill_complete(r)) r.prefilled_ns = now_ns;
}

void SendScheduler::find_stalls(uint64_t now_ns, uint64_t after_ns, std::vector<Stall>& out) {
  out.clear();
  for (auto& [handle, ptr] : requests_) {
    Request& r = *ptr;
    const uint64_t since = r.ending ? r.ending_ns : r.prefilled_ns;
    if (since == 0 || now_ns < since || now_ns - since < after_ns) continue;
    const StallReason reason = r.ending      ? StallReason::kWithdrawing
                               : !r.has_dest ? StallReason::kNoDecodeHalf
                                             : StallReason::kTransfersInFlight;
    out.push_back(Stall{&r.id, r.slot, reason, since, r.in_flight,
                        r.destination ? &r.destination->peer() : nullptr, !r.stall_listed});
    r.stall_listed = true;
  }
  std::sort(out.begin(), out.end(),
            [](const Stall& a, const Stall& b) { return a.since_ns < b.since_ns; });
}

void SendScheduler::on_session_ended(uint32_t session) {
  if (session == 0) return;
  for (Slot& slot : slots_) {
    const size_t before = slot.pending.size();
    std::erase_if(slot.pending, [&](const Session& s) { return s.pusher == session; });
    const size_t gone = before - slot.pending.size();
    pending_sessions_ -= gone;
    counters_.stale_sessions += gone;
  }
}

void SendScheduler::on_dest(uint64_t handle, schema::CacheDest::Reader dest, uint64_t read_ns) {
  auto it = requests_.find(handle);
  if (it == requests_.end()) {
    report_(handle, ReportKind::kFailed, 0,
            "this rank does not know the request (its worker restarted after the request was "
            "bound)",
            0);
    return;
  }
  Request& r = *it->second;
  if (r.has_dest || r.ending) return;
  const auto ids = dest.getDestBlockIds();
  if (ids.size() > r.src.size()) {
    end(r, ReportKind::kFailed, "more destination blocks than source blocks");
    return;
  }
  Result<std::shared_ptr<Destination>> target = transport_.resolve(dest);
  if (!target) {
    end(r, ReportKind::kFailed, target.error().message);
    return;
  }
  r.destination = std::move(target).value();
  r.dst = messages::to_vector(ids);
  r.key = request_key(r.id, dest.getRequestNonce());
  for (uint32_t b : r.dst)
    r.dst_block_end = std::max(r.dst_block_end, b + 1);
  // Before anything moves: a block the destination's pool lacks fails the
  // request with nothing written. A network destination whose pool is not
  // known yet checks the same before its first byte (TransferTicket).
  for (uint32_t layer = 0; layer < layers_; ++layer) {
    const uint32_t there = r.destination->blocks_in_layer(layer);
    if (there != UINT32_MAX && r.dst_block_end > there) {
      end(r, ReportKind::kFailed,
          fmt::format("destination block {} is outside the pool of {}, which has {} blocks in "
                      "layer {}: nothing of this request was sent",
                      r.dst_block_end - 1, r.destination->peer(), there, layer));
      return;
    }
  }
  r.prefix = static_cast<uint32_t>(r.src.size() - r.dst.size());
  r.sent.assign(layers_, r.prefix);
  r.has_dest = true;
  spdlog::debug("dest '{}': {} blocks, prefix {}", r.id, r.dst.size(), r.prefix);
  const uint64_t serial = r.serial;
  advance(r, mono_now_ns());  // catch up on everything already prefilled (may end r)
  // The dispatch hop: timed only when the copy began at once, i.e. when the
  // destination was all the request still waited for (a request that failed
  // in advance() is no dispatch sample).
  if (auto again = requests_.find(handle);
      hop_ && read_ns != 0 && again != requests_.end() && again->second->serial == serial &&
      again->second->first_copy_ns >= read_ns)
    hop_(kDestReadToCopyNs, again->second->first_copy_ns - read_ns);
  poll_transfers();
}

void SendScheduler::on_cancel(uint64_t handle) {
  auto it = requests_.find(handle);
  if (it == requests_.end()) {
    // Unknown here (already finished, or bound before this worker restarted):
    // still answer, so that the coordinator can settle the request.
    report_(handle, ReportKind::kCancelled, 0, "", 0);
    return;
  }
  if (it->second->ending) return;  // it reports once its transfers complete
  end(*it->second, ReportKind::kCancelled, "");
}

void SendScheduler::on_signal(const records::LayerSignal& signal, uint64_t index) {
  signal_pushed_ns_ = records::carries_push_stamp(signal.kind) ? signal.pushed_ns : 0;
  handle_signal(signal, index);
  signal_pushed_ns_ = 0;
}

void SendScheduler::handle_signal(const records::LayerSignal& signal, uint64_t index) {
  ++counters_.signals;
  const uint64_t now = mono_now_ns();
  switch (static_cast<SignalKind>(signal.kind)) {
    case SignalKind::kBatch: {
      // A batch record after layer records starts a new batch, even with a
      // step number seen before; consecutive batch records of one step are
      // one large batch.
      if (signal.step != batch_step_ || !batch_open_) {
        batch_step_ = signal.step;
        batch_.clear();
      }
      batch_open_ = true;
      const uint32_t n = std::min(signal.count, records::kBatchEntriesPerSignal);
      for (uint32_t i = 0; i < n; ++i)
        on_batch_entry(signal.entries[i], signal.session, index);
      return;
    }
    case SignalKind::kLayerDone: {
      batch_open_ = false;
      if (signal.step != batch_step_ || signal.layer >= layers_) {
        ++counters_.bad_signals;
        return;
      }
      touched_.clear();
      for (const BatchItem& item : batch_) {
        Request* owner = nullptr;
        Progress* p = progress_for(item.slot, item.tag, &owner);
        if (p == nullptr) continue;
        uint64_t& t = p->tokens[signal.layer];
        t = std::max(t, item.tokens_after);
        if (owner != nullptr) {
          touched_.push_back(owner->handle);
        } else if (item.tag == 0 && signal.layer + 1 == layers_) {
          slots_[item.slot].unowned_final =
              UnownedChunk{true, item.index, signal.step, item.tokens_after};
        }
      }
      for (size_t i = 0; i < touched_.size(); ++i) {
        auto it = requests_.find(touched_[i]);  // an earlier advance may have ended it
        if (it == requests_.end()) continue;
        note_prefill_progress(*it->second, now);
        advance(*it->second, now);
        it = requests_.find(touched_[i]);
        if (it != requests_.end()) release_slot_if_done(*it->second);
      }
      poll_transfers();
      return;
    }
    case SignalKind::kLegacyLayerDone: {
      batch_open_ = false;
      if (signal.layer >= layers_) {
        ++counters_.bad_signals;
        return;
      }
      if (!legacy_seen_ || signal.step > legacy_step_ ||
          (signal.step == legacy_step_ && signal.layer > legacy_layer_)) {
        legacy_seen_ = true;
        legacy_step_ = signal.step;
        legacy_layer_ = signal.layer;
      }
      legacy_walk_.assign(legacy_requests_.begin(), legacy_requests_.end());
      for (uint64_t h : legacy_walk_) {
        auto it = requests_.find(h);
        if (it == requests_.end()) continue;
        note_prefill_progress(*it->second, now);
        advance(*it->second, now);
      }
      poll_transfers();
      return;
    }
    case SignalKind::kDeviceLayers:
      // The worker follows these itself (device_signal_watch.h) and hands
      // on only host-written records: one here is a bad record.
      break;
  }
  ++counters_.bad_signals;
}

// A batch entry: remember it for the step's layer records, and notice a slot
// that moved on to another request.
void SendScheduler::on_batch_entry(const records::BatchEntry& e, uint32_t pusher, uint64_t index) {
  if (e.slot >= kMaxSlots) {
    ++counters_.bad_signals;
    return;
  }
  const uint64_t tokens_after = uint64_t{e.chunk_token_offset} + e.chunk_len;
  Slot& slot = slots_[e.slot];
  for (uint64_t h : slot.bound) {
    auto it = requests_.find(h);
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    const bool same = e.request_tag != 0 ? r.tag == e.request_tag
                                         : !(e.chunk_token_offset == 0 && r.progress.tokens[0] > 0);
    if (same) continue;
    moved_on_.push_back(h);
  }
  for (uint64_t h : moved_on_) {
    auto it = requests_.find(h);
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    if (prefill_complete(r)) {
      unbind(r);
    } else {
      end(r, ReportKind::kFailed,
          fmt::format("engine slot {} moved on to another request before this request's prefill "
                      "completed",
                      e.slot));
    }
  }
  moved_on_.clear();
  Request* owner = nullptr;
  Progress* progress = progress_for(e.slot, e.request_tag, &owner);
  if (owner != nullptr && e.request_tag != 0) owner->tagged = true;
  if (progress == nullptr || (owner == nullptr && e.request_tag == 0)) {
    Session& s = pending_session(slot, e.request_tag, e.chunk_token_offset, index);
    s.last_index = index;
    s.pusher = pusher;
  }
  batch_.push_back(BatchItem{e.slot, e.request_tag, tokens_after, index});
  if (spdlog::should_log(spdlog::level::trace))
    spdlog::trace("slot {} tag {:08x} tokens [{}, {}) -> {}", e.slot, e.request_tag,
                  e.chunk_token_offset, tokens_after,
                  owner != nullptr ? owner->id : std::string("pending"));
}

// The progress that signals for (slot, tag) update: the bound request's, or
// a pending session's; nullptr if neither exists.
SendScheduler::Progress* SendScheduler::progress_for(uint32_t slot_id, uint32_t tag,
                                                     Request** owner) {
  Slot& slot = slots_[slot_id];
  for (auto h = slot.bound.rbegin(); h != slot.bound.rend(); ++h) {
    auto it = requests_.find(*h);
    if (it == requests_.end()) continue;
    if (tag == 0 || it->second->tag == tag) {
      *owner = it->second.get();
      return &it->second->progress;
    }
  }
  for (auto s = slot.pending.rbegin(); s != slot.pending.rend(); ++s) {
    if (s->tag == tag) return &s->progress;
  }
  return nullptr;
}

SendScheduler::Session& SendScheduler::pending_session(Slot& slot, uint32_t tag, uint32_t offset,
                                                       uint64_t index) {
  if (tag != 0) {
    for (Session& s : slot.pending)
      if (s.tag == tag) return s;
  } else if (offset != 0 && !slot.pending.empty() && slot.pending.back().tag == 0) {
    return slot.pending.back();  // the untagged request's next chunk
  }
  if (pending_sessions_ >= kMaxPendingSessions) {  // drop the oldest, wherever it is
    Slot* oldest = nullptr;
    for (Slot& candidate : slots_)
      if (!candidate.pending.empty() &&
          (oldest == nullptr || candidate.pending.front().seq < oldest->pending.front().seq))
        oldest = &candidate;
    oldest->pending.pop_front();
    --pending_sessions_;
    ++counters_.dropped_sessions;
  }
  ++pending_sessions_;
  Session s;
  s.tag = tag;
  s.seq = ++session_seq_;
  s.first_index = index;
  s.last_index = index;
  s.progress.tokens.assign(layers_, 0);
  slot.pending.push_back(std::move(s));
  return slot.pending.back();
}

bool SendScheduler::prefill_complete(const Request& r) const {
  if (r.legacy) {
    return legacy_seen_ && (legacy_step_ > r.legacy_step ||
                            (legacy_step_ == r.legacy_step && legacy_layer_ + 1 >= layers_));
  }
  for (uint64_t t : r.progress.tokens)
    if (t < r.need_tokens) return false;
  return true;
}

uint32_t SendScheduler::computed_blocks(const Request& r, uint32_t layer) const {
  const auto all = static_cast<uint32_t>(r.src.size());
  if (r.legacy) {
    if (!legacy_seen_) return 0;
    if (legacy_step_ > r.legacy_step) return all;
    return legacy_step_ == r.legacy_step && layer <= legacy_layer_ ? all : 0;
  }
  const uint64_t tokens = r.progress.tokens[layer];
  if (tokens >= r.need_tokens) return all;
  return static_cast<uint32_t>(std::min<uint64_t>(tokens / local_.block_size, all));
}

void SendScheduler::advance(Request& r, uint64_t signal_ns) {
  if (!r.has_dest || r.ending) return;
  for (uint32_t layer = 0; layer < layers_; ++layer) {
    const uint32_t from = r.sent[layer];
    const uint32_t to = computed_blocks(r, layer);
    if (to <= from) continue;
    if (Status s = plan_block_runs(
            std::span<const uint32_t>(r.src).subspan(from, to - from),
            std::span<const uint32_t>(r.dst).subspan(from - r.prefix, to - from),
            local_.blocks_in_layer(layer), r.destination->blocks_in_layer(layer), rank_, layer,
            runs_);
        !s) {
      end(r, ReportKind::kFailed, s.error().message);
      return;
    }
    TransferTicket ticket;
    ticket.handle = r.handle;
    ticket.request_serial = r.serial;
    ticket.request_key = r.key;
    ticket.dst_block_end = r.dst_block_end;
    ticket.layer = layer;
    ticket.signal_ns = signal_ns;
    ticket.submit_ns = mono_now_ns();
    if (r.first_copy_ns == 0) r.first_copy_ns = ticket.submit_ns;
    if (Status s = r.destination->submit_layer(ticket, layer, runs_); !s) {
      end(r, ReportKind::kFailed, transfer_failure(s.error().message, layer, *r.destination));
      return;
    }
    r.sent[layer] = to;
    r.released_by_push_ns = signal_pushed_ns_;
    const uint32_t transfers = r.destination->transfers_per_submit();
    r.in_flight += transfers;
    transfers_in_flight_ += transfers;
  }
  finish_if_done(r);
}

void SendScheduler::poll_transfers() {
  completions_.clear();
  transport_.poll(completions_);
  for (const TransferCompletion& c : completions_)
    on_transfer_done(c);
}

void SendScheduler::on_transfer_done(const TransferCompletion& c) {
  auto it = requests_.find(c.ticket.handle);
  if (it == requests_.end() || it->second->serial != c.ticket.request_serial) return;
  Request& r = *it->second;
  --r.in_flight;
  --transfers_in_flight_;
  if (!c.status) {
    if (r.ending) {
      end(r, r.end_kind, r.end_message);  // the first reason to end stands
    } else {
      end(r, ReportKind::kFailed,
          transfer_failure(c.status.error().message, c.ticket.layer, *r.destination));
    }
    return;
  }
  r.bytes += c.bytes;
  counters_.bytes += c.bytes;
  ++counters_.layer_copies;
  r.done_ns = mono_now_ns();
  if (latency_)
    latency_(c.ticket.layer, r.done_ns - c.ticket.signal_ns, r.done_ns - c.ticket.submit_ns,
             c.bytes);
  if (r.ending) {
    end(r, r.end_kind, r.end_message);
    return;
  }
  finish_if_done(r);
}

// Finished: the prefill is complete and every block of every layer is
// applied at the destination. May destroy `r`.
void SendScheduler::finish_if_done(Request& r) {
  if (r.in_flight != 0 || !prefill_complete(r)) return;
  const auto all = static_cast<uint32_t>(r.src.size());
  for (uint32_t s : r.sent)
    if (s != all) return;
  end(r, ReportKind::kFinished, "");
}

void SendScheduler::unbind(Request& r) {
  if (!r.owns_slot) return;
  std::erase(slots_[r.slot].bound, r.handle);
  r.owns_slot = false;
}

void SendScheduler::release_slot_if_done(Request& r) {
  if (r.owns_slot && prefill_complete(r)) unbind(r);
}

void SendScheduler::end(Request& r, ReportKind kind, const std::string& message) {
  unbind(r);
  if (r.legacy) std::erase(legacy_requests_, r.handle);
  if (r.in_flight != 0) {
    // Its transfers may still write the destination blocks: the report waits
    // for them (on_transfer_done), and the first reason to end is kept.
    if (!r.ending) {
      r.ending = true;
      r.ending_ns = mono_now_ns();
      r.end_kind = kind;
      r.end_message = message;
    }
    return;
  }
  spdlog::debug("end '{}' (handle {}): kind {} {}", r.id, r.handle, static_cast<uint32_t>(kind),
                message);
  switch (kind) {
    case ReportKind::kFinished: ++counters_.finished; break;
    case ReportKind::kCancelled: ++counters_.cancelled; break;
    default:
      ++counters_.failed;
      spdlog::warn("request '{}' failed on rank {}: {}", r.id, rank_, message);
      break;
  }
  // Timed as the report is written: once it is, the request may complete
  // and its hops be read before this rank would get to it.
  if (hop_ && kind == ReportKind::kFinished) {
    const uint64_t now = mono_now_ns();
    if (r.done_ns != 0) hop_(kCopyDoneToReportNs, now - r.done_ns);
    // The engine's stamp: timed only when it is sane.
    if (const auto waited = stamp_age(r.released_by_push_ns, now))
      hop_(kLastSignalToReportNs, *waited);
  }
  report_(r.handle, kind, r.bytes, message, r.first_copy_ns);
  requests_.erase(r.handle);  // destroys r
}

}  // namespace kvrelay::worker
