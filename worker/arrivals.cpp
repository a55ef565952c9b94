#include "worker/arrivals.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvrelay::worker {

namespace {
// Arrived or withdrawn requests whose writes are still refused: this many, for
// this long (a sender learns of a failure within its peer timeout; an id used
// again after that is a new request).
constexpr size_t kRememberGone = 4096;
constexpr Nanos kGone = std::chrono::seconds(60);
// Writes of undeclared requests, credited if the request is declared later
// (its declaration can reach this rank after the sender's first writes):
// this many, for this long.
constexpr size_t kRememberEarly = 1 << 18;
constexpr Nanos kEarly = std::chrono::seconds(60);
}  // namespace

Arrivals::Arrivals(const PoolGeometry& pool, WaitEvent* doorbell)
    : pool_(pool),
      doorbell_(doorbell),
      owner_(std::max(pool.num_blocks, pool.extra_layer_blocks), 0),
      index_in_owner_(owner_.size(), 0) {}

Status Arrivals::expect(uint64_t handle, const std::string& id, const std::vector<uint32_t>& blocks,
                        const std::string& from, uint64_t nonce) {
  const uint64_t key = request_key(id, nonce);
  std::lock_guard<std::mutex> lock(mu_);
  if (expected_.count(key) != 0)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("request '{}' is expected here already", id));
  for (uint32_t b : blocks) {
    if (b >= owner_.size())
      return make_error(
          Errc::kInvalidArgument,
          fmt::format("destination block {} is outside the pool's {} blocks", b, owner_.size()));
    if (owner_[b] != 0)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("destination block {} is expected by request '{}' already", b,
                                    expected_.at(owner_[b]).id));
  }
  gone_ids_.erase(key);  // an id used again (after its tombstone expired upstream)
  std::erase_if(gone_, [&](const Gone& g) { return g.key == key; });
  Expected e;
  e.handle = handle;
  e.id = id;
  e.from = from;
  e.blocks = blocks;
  e.missing = uint64_t{pool_.total_layers()} * pool_.tensors_per_layer() * blocks.size();
  e.arrived.assign((e.missing + 63) / 64, 0);
  for (uint32_t i = 0; i < blocks.size(); ++i) {
    owner_[blocks[i]] = key;
    index_in_owner_[blocks[i]] = i;
  }
  if (auto w = undeclared_writing_.find(key); w != undeclared_writing_.end()) {
    e.writing = w->second;  // admitted before the declaration, still being written
    undeclared_writing_.erase(w);
  }
  by_handle_[handle] = key;
  Expected& mine = expected_.emplace(key, std::move(e)).first->second;
  credit_early(key, mine);
  if (expected_.count(key) != 0 && !mine.withdrawn && mine.missing == 0)
    finish(key, ArrivalEvent::kArrived, "");
  return {};
}

// What landed of `key` before it was declared counts now; a write that went
// outside its blocks fails it. Called with mu_ held.
void Arrivals::credit_early(uint64_t key, Expected& e) {
  forget_old_early();
  auto it = early_.find(key);
  if (it == early_.end()) return;
  std::vector<Early> senders = std::move(it->second);
  early_.erase(it);
  for (const Early& early : senders) {
    early_entries_ -= early.writes.size();
    // Another instance's early writes count for nothing (their order
    // entries find nothing and go).
    if (!e.from.empty() && early.sender != e.from) continue;
    for (const EarlyWrite& w : early.writes) {
      if (e.withdrawn) break;
      for (uint32_t b = w.first; b <= w.last; ++b) {
        if (owner_[b] != key) {
          const std::string why = fmt::format(
              "a write of request '{}' went to destination block "
              "{} before it was declared, which it did not declare",
              e.id, b);
          e.withdrawn = true;
          e.failure = why;
          if (e.writing == 0) finish(key, ArrivalEvent::kFailed, why);
          return;
        }
      }
      mark(e, w);
    }
  }
}

void Arrivals::remember_early(uint64_t key, std::string_view sender, const Span& span) {
  forget_old_early();
  std::vector<Early>& senders = early_[key];
  auto mine = std::find_if(senders.begin(), senders.end(),
                           [&](const Early& e) { return e.sender == sender; });
  if (mine == senders.end()) {
    senders.push_back(Early{std::string(sender), mono_now_ns(), {}});
    mine = senders.end() - 1;
    early_order_.push_back(EarlyName{key, mine->sender});
  }
  mine->writes.push_back(span);
  ++early_entries_;
  while (early_entries_ > kRememberEarly && !early_order_.empty()) {
    drop_early(early_order_.front().key, early_order_.front().sender);
    early_order_.pop_front();
  }
}

// Forgets `sender`'s early writes of `key`, if still remembered.
void Arrivals::drop_early(uint64_t key, const std::string& sender) {
  auto it = early_.find(key);
  if (it == early_.end()) return;
  std::vector<Early>& senders = it->second;
  auto mine = std::find_if(senders.begin(), senders.end(),
                           [&](const Early& e) { return e.sender == sender; });
  if (mine == senders.end()) return;
  early_entries_ -= mine->writes.size();
  senders.erase(mine);
  if (senders.empty()) early_.erase(it);
}

void Arrivals::forget_old_early() {
  const uint64_t now = mono_now_ns();
  while (!early_order_.empty()) {
    const EarlyName& oldest = early_order_.front();
    if (auto it = early_.find(oldest.key); it != early_.end()) {
      auto mine = std::find_if(it->second.begin(), it->second.end(),
                               [&](const Early& e) { return e.sender == oldest.sender; });
      if (mine != it->second.end() && now - mine->since_ns <= ns_of(kEarly)) break;
    }
    drop_early(oldest.key, oldest.sender);
    early_order_.pop_front();
  }
}

// Sets the arrived bits of the span's blocks; a head range sets its heads'
// bits in the block's mask, and the block's bit once the mask is full.
void Arrivals::mark(Expected& e, const Span& span) {
  const auto tensor = static_cast<PoolTensor>(span.tensor);
  const uint64_t block = pool_.block_bytes(tensor);
  const uint64_t row =
      (uint64_t{span.layer} * pool_.tensors_per_layer() + pool_.slot_of(tensor)) * e.blocks.size();
  for (uint32_t b = span.first; b <= span.last; ++b) {
    const uint64_t bit = row + index_in_owner_[b];
    uint64_t& word = e.arrived[bit / 64];
    if ((word & (1ull << (bit % 64))) != 0) continue;
    if (span.heads != 0) {
      std::vector<uint64_t>& mask = e.partial[bit];
      if (mask.empty()) mask.assign((pool_.kv_heads + 63) / 64, 0);
      uint32_t have = 0;
      for (uint32_t h = span.first_head; h < span.first_head + span.heads; ++h)
        mask[h / 64] |= 1ull << (h % 64);
      for (uint64_t m : mask) have += static_cast<uint32_t>(__builtin_popcountll(m));
      if (have < pool_.kv_heads) continue;
      e.partial.erase(bit);
    }
    word |= 1ull << (bit % 64);
    --e.missing;
    e.bytes += block;
  }
}

bool Arrivals::withdraw(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto h = by_handle_.find(handle);
  if (h == by_handle_.end()) return false;
  Expected& e = expected_.at(h->second);
  e.withdrawn = true;
  e.failure.clear();  // the withdrawal is the answer now
  if (e.writing == 0) finish(h->second, ArrivalEvent::kWithdrawn, "");
  return true;
}

bool Arrivals::write_span(const LandedWrite& f, Span* span) const {
  if (!pool_.has_tensor_id(f.tensor)) return false;  // a K-only pool has no V
  const uint64_t block = pool_.block_bytes(static_cast<PoolTensor>(f.tensor));
  if (block == 0 || f.bytes == 0) return false;
  span->layer = f.layer;
  span->tensor = f.tensor;
  span->first = static_cast<uint32_t>(f.dst_offset / block);
  span->first_head = span->heads = 0;
  if (f.dst_offset % block == 0 && f.bytes % block == 0) {
    span->last = static_cast<uint32_t>((f.dst_offset + f.bytes) / block - 1);
    return span->last < owner_.size();
  }
  // A head range: whole heads, within one block.
  const uint64_t head = block / pool_.kv_heads;
  const uint64_t at = f.dst_offset % block;
  if (at % head != 0 || f.bytes % head != 0 || at + f.bytes > block) return false;
  span->last = span->first;
  span->first_head = static_cast<uint32_t>(at / head);
  span->heads = static_cast<uint32_t>(f.bytes / head);
  return span->first < owner_.size();
}

Status Arrivals::admit(const LandedWrite& f) {
  Span span{};
  if (!write_span(f, &span)) return {};  // the shape check refuses it
  const uint32_t first = span.first, last = span.last;
  std::lock_guard<std::mutex> lock(mu_);
  forget_old_gone();
  auto gone = gone_ids_.find(f.request_key);
  if (gone != gone_ids_.end())
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("request '{}' has already arrived here or was withdrawn", gone->second));
  auto mine = expected_.find(f.request_key);
  if (mine != expected_.end() && !counts_for(mine->second, f))
    return make_error(Errc::kPermissionDenied,
                      fmt::format("request '{}' is expected from instance '{}', not from '{}'",
                                  mine->second.id, mine->second.from, f.sender));
  for (uint32_t b = first; b <= last; ++b) {
    if (owner_[b] == f.request_key && mine != expected_.end()) continue;
    if (mine != expected_.end()) {
      const std::string why = fmt::format(
          "a write of request '{}' goes to destination block {}, "
          "which it did not declare",
          mine->second.id, b);
      if (!mine->second.withdrawn) {
        mine->second.withdrawn = true;  // it fails once its writes in progress are done
        mine->second.failure = why;
        if (mine->second.writing == 0) finish(f.request_key, ArrivalEvent::kFailed, why);
      }
      return make_error(Errc::kInvalidArgument, why);
    }
    if (owner_[b] != 0)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("a write goes to destination block {}, which request '{}' "
                                    "declared",
                                    b, expected_.at(owner_[b]).id));
  }
  if (mine != expected_.end()) {
    if (mine->second.withdrawn)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("request '{}' was withdrawn here", mine->second.id));
    ++mine->second.writing;
  } else {
    ++undeclared_writing_[f.request_key];  // counted in if it is declared meanwhile
  }
  return {};
}

// An admitted write of an undeclared request is over. Called with mu_ held.
void Arrivals::undeclared_write_over(uint64_t key) {
  auto it = undeclared_writing_.find(key);
  if (it != undeclared_writing_.end() && --it->second == 0) undeclared_writing_.erase(it);
}

void Arrivals::landed(const LandedWrite& f) {
  Span span{};
  if (!write_span(f, &span)) return;
  const uint32_t first = span.first, last = span.last;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = expected_.find(f.request_key);
  if (it == expected_.end()) {  // undeclared: counts if it is declared soon
    undeclared_write_over(f.request_key);
    if (f.request_key != 0 && gone_ids_.count(f.request_key) == 0)
      remember_early(f.request_key, f.sender, span);
    return;
  }
  Expected& e = it->second;
  if (e.writing > 0) --e.writing;
  if (!counts_for(e, f)) {
    // Admitted before the declaration, from another instance: it held the
    // request's withdrawal while it was written, and counts for nothing.
    if (e.withdrawn && e.writing == 0)
      finish(f.request_key, e.failure.empty() ? ArrivalEvent::kWithdrawn : ArrivalEvent::kFailed,
             e.failure);
    return;
  }
  // Admitted before the request was declared: its blocks were not checked
  // against the declaration then.
  for (uint32_t b = first; b <= last && !e.withdrawn; ++b) {
    if (owner_[b] == f.request_key) continue;
    e.withdrawn = true;
    e.failure = fmt::format(
        "a write of request '{}' went to destination block {}, which it did "
        "not declare",
        e.id, b);
  }
  if (e.withdrawn) {
    if (e.writing == 0)
      finish(f.request_key, e.failure.empty() ? ArrivalEvent::kWithdrawn : ArrivalEvent::kFailed,
             e.failure);
    return;
  }
  mark(e, span);
  e.last_landed_ns = std::max(e.last_landed_ns, f.landed_ns);
  if (e.missing == 0) finish(f.request_key, ArrivalEvent::kArrived, "");
}

void Arrivals::abandoned(const LandedWrite& f) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = expected_.find(f.request_key);
  if (it == expected_.end()) {
    undeclared_write_over(f.request_key);
    return;
  }
  Expected& e = it->second;
  if (e.writing > 0) --e.writing;
  if (e.withdrawn && e.writing == 0)
    finish(f.request_key, e.failure.empty() ? ArrivalEvent::kWithdrawn : ArrivalEvent::kFailed,
           e.failure);
}

// Ends a declared request: its blocks are free again, its later writes are
// refused, and the worker hears of it. Called with mu_ held.
void Arrivals::finish(uint64_t key, ArrivalEvent::Kind kind, const std::string& message) {
  auto it = expected_.find(key);
  if (it == expected_.end()) return;
  Expected& e = it->second;
  for (uint32_t b : e.blocks)
    if (owner_[b] == key) owner_[b] = 0;
  events_.push_back(ArrivalEvent{e.handle, kind, e.bytes, message,
                                 kind == ArrivalEvent::kArrived ? e.last_landed_ns : 0});
  by_handle_.erase(e.handle);
  remember_gone(key, e.id);
  expected_.erase(it);
  if (doorbell_ != nullptr) notify_waiters(*doorbell_);
}

void Arrivals::remember_gone(uint64_t key, const std::string& id) {
  gone_.push_back(Gone{key, mono_now_ns()});
  gone_ids_[key] = id;
  if (gone_.size() > kRememberGone) {
    gone_ids_.erase(gone_.front().key);
    gone_.pop_front();
  }
}

void Arrivals::forget_old_gone() {
  const uint64_t now = mono_now_ns();
  while (!gone_.empty() && now - gone_.front().at_ns > ns_of(kGone)) {
    gone_ids_.erase(gone_.front().key);
    gone_.pop_front();
  }
}

std::vector<ArrivalEvent> Arrivals::take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(events_, {});
}

bool Arrivals::expects(uint64_t handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_handle_.count(handle) != 0;
}

bool Arrivals::withdrawing(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = expected_.find(key);
  return it != expected_.end() && it->second.withdrawn;
}

bool Arrivals::any() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !events_.empty();
}

}  // namespace kvrelay::worker
