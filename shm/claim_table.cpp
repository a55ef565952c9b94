#include "shm/claim_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <new>

namespace kvrelay {

namespace {

static_assert((kClaimEntries & (kClaimEntries - 1)) == 0);

uint32_t place(uint32_t home, uint32_t i) {
  return (home + i) & (kClaimEntries - 1);
}

// A sequence lock left odd (its owner died mid-rewrite) must not hold a
// writer forever: after this many tries the entry reads as closed.
constexpr int kSequenceTries = 1000;

}  // namespace

// Fibonacci hashing: keys are FNV-1a hashes already, this spreads their low bits.
uint32_t claim_home(uint64_t key) {
  return static_cast<uint32_t>((key * 0x9E3779B97F4A7C15ull) >> 32) & (kClaimEntries - 1);
}

void mark_claim_table_in_use(std::span<std::byte> region) {
  auto* h = reinterpret_cast<ClaimTableHeader*>(region.data());
  if (h->in_use.load(std::memory_order_relaxed) == 0) h->in_use.store(1, std::memory_order_seq_cst);
}

void initialize_claim_table(std::span<std::byte> region) {
  auto* h = new (region.data()) ClaimTableHeader{};
  h->epoch.store(1, std::memory_order_relaxed);
}

// ---- writers ----

ClaimWriterView::ClaimWriterView(std::span<std::byte> region, uint32_t blocks, uint32_t writer)
    : h_(reinterpret_cast<ClaimTableHeader*>(region.data())),
      claims_(reinterpret_cast<std::atomic<uint32_t>*>(region.data() + sizeof(ClaimTableHeader))),
      blocks_(blocks),
      writer_(writer % kClaimWriters) {}

uint64_t ClaimWriterView::announce(uint64_t held) {
  const uint64_t epoch = h_->epoch.load(std::memory_order_seq_cst);
  h_->writers[writer_].announced_epoch.store(held != 0 ? held : epoch, std::memory_order_seq_cst);
  // StoreLoad: the table reads that follow must not pass the announcement.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return epoch;
}

void ClaimWriterView::set_announcement(uint64_t oldest) {
  h_->writers[writer_].announced_epoch.store(oldest, std::memory_order_seq_cst);
}

ClaimLookup ClaimWriterView::lookup(uint64_t key, uint64_t now_ns) const {
  const uint32_t home = claim_home(key);
  for (uint32_t i = 0; i < kClaimProbe; ++i) {
    const uint32_t e = place(home, i);
    ClaimEntry& entry = h_->entries[e];
    for (int attempt = 0;; ++attempt) {
      if (attempt == kSequenceTries) return ClaimLookup{ClaimState::kClosed, e};
      const uint32_t s1 = entry.sequence.load(std::memory_order_acquire);
      if (s1 % 2 != 0) continue;
      const uint64_t k = entry.key.load(std::memory_order_relaxed);
      const uint32_t state = entry.state.load(std::memory_order_relaxed);
      const uint64_t closed_at = entry.closed_at_ns.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (entry.sequence.load(std::memory_order_relaxed) != s1) continue;
      if (k != key) break;
      if (state == static_cast<uint32_t>(ClaimState::kOpen))
        return ClaimLookup{ClaimState::kOpen, e};
      // A writer reads its clock before it looks, so an owner that closes in
      // between stamps a time after now_ns: that close is recent, not one
      // that wrapped round to long ago (the key would read as free, and with
      // its claims cleared every block would admit its write).
      if (state == static_cast<uint32_t>(ClaimState::kClosed) &&
          (closed_at >= now_ns || now_ns - closed_at < kClaimRememberNs))
        return ClaimLookup{ClaimState::kClosed, e};
      break;
    }
  }
  return {};
}

uint32_t ClaimWriterView::claim_of(uint32_t block) const {
  if (block >= blocks_) return 0;
  return claims_[block].load(std::memory_order_acquire);
}

// ---- the owner ----

ClaimOwner::ClaimOwner(std::span<std::byte> region, uint32_t blocks)
    : h_(reinterpret_cast<ClaimTableHeader*>(region.data())),
      claims_(reinterpret_cast<std::atomic<uint32_t>*>(region.data() + sizeof(ClaimTableHeader))),
      blocks_(blocks),
      entry_key_(kClaimEntries, 0),
      entry_closed_ns_(kClaimEntries, 0),
      local_claims_(blocks, 0) {}

void ClaimOwner::reset() {
  for (uint32_t e = 0; e < kClaimEntries; ++e)
    rewrite(e, ClaimState::kFree, 0, 0);
  for (uint32_t b = 0; b < blocks_; ++b)
    claims_[b].store(0, std::memory_order_relaxed);
  std::fill(entry_key_.begin(), entry_key_.end(), 0);
  std::fill(entry_closed_ns_.begin(), entry_closed_ns_.end(), 0);
  std::fill(local_claims_.begin(), local_claims_.end(), 0);
  claims_by_key_.clear();
  // A writer that admitted something under the old claims sees a new epoch.
  h_->epoch.fetch_add(1, std::memory_order_seq_cst);
}

void ClaimOwner::rewrite(uint32_t e, ClaimState state, uint64_t key, uint64_t closed_at_ns) {
  ClaimEntry& entry = h_->entries[e];
  const uint32_t s = entry.sequence.load(std::memory_order_relaxed) | 1u;  // ours: never odd
  entry.sequence.store(s, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  entry.key.store(key, std::memory_order_relaxed);
  entry.state.store(static_cast<uint32_t>(state), std::memory_order_relaxed);
  entry.closed_at_ns.store(closed_at_ns, std::memory_order_relaxed);
  entry.sequence.store(s + 1, std::memory_order_release);
}

Status ClaimOwner::open(uint64_t key, std::span<const uint32_t> blocks, uint64_t now_ns) {
  if (key == 0) return make_error(Errc::kInvalidArgument, "claim key 0 is reserved");
  if (claims_by_key_.count(key) != 0)
    return make_error(Errc::kInvalidArgument, "the key holds a claim already");
  for (uint32_t b : blocks) {
    if (b >= blocks_)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("block {} is outside the pool's {} blocks", b, blocks_));
    if (local_claims_[b] != 0)
      return make_error(Errc::kInvalidArgument, fmt::format("block {} is claimed already", b));
  }
  // Its own closed entry, else a free or forgotten one, else the oldest closed one.
  const uint32_t home = claim_home(key);
  uint32_t chosen = kClaimEntries;
  for (uint32_t i = 0; i < kClaimProbe && chosen == kClaimEntries; ++i)
    if (entry_key_[place(home, i)] == key) chosen = place(home, i);
  for (uint32_t i = 0; i < kClaimProbe && chosen == kClaimEntries; ++i) {
    const uint32_t e = place(home, i);
    const bool forgotten =
        entry_closed_ns_[e] != 0 && now_ns > entry_closed_ns_[e] &&
        now_ns - entry_closed_ns_[e] >= kClaimRememberNs;
    if (entry_key_[e] == 0 || forgotten) chosen = e;
  }
  uint64_t oldest = UINT64_MAX;
  for (uint32_t i = 0; i < kClaimProbe && chosen == kClaimEntries; ++i) {
    const uint32_t e = place(home, i);
    if (entry_closed_ns_[e] != 0 && entry_closed_ns_[e] < oldest) oldest = entry_closed_ns_[e];
  }
  for (uint32_t i = 0; i < kClaimProbe && chosen == kClaimEntries && oldest != UINT64_MAX; ++i)
    if (entry_closed_ns_[place(home, i)] == oldest) chosen = place(home, i);
  if (chosen == kClaimEntries)
    return make_error(Errc::kFull,
                      fmt::format("{} open claims fill this key's {} places in the table",
                                  kClaimProbe, kClaimProbe));
  rewrite(chosen, ClaimState::kOpen, key, 0);
  entry_key_[chosen] = key;
  entry_closed_ns_[chosen] = 0;
  for (uint32_t b : blocks) {
    local_claims_[b] = chosen + 1;
    claims_[b].store(chosen + 1, std::memory_order_release);
  }
  claims_by_key_.emplace(key, Claim{chosen, std::vector<uint32_t>(blocks.begin(), blocks.end())});
  return {};
}

uint64_t ClaimOwner::close(uint64_t key, uint64_t now_ns) {
  auto it = claims_by_key_.find(key);
  if (it == claims_by_key_.end()) return 0;
  const Claim& c = it->second;
  for (uint32_t b : c.blocks) {
    local_claims_[b] = 0;
    claims_[b].store(0, std::memory_order_relaxed);
  }
  const uint64_t closed_at = std::max<uint64_t>(now_ns, 1);
  rewrite(c.entry, ClaimState::kClosed, key, closed_at);
  entry_closed_ns_[c.entry] = closed_at;
  claims_by_key_.erase(it);
  // seq_cst: ordered after the stores above and before quiescent()'s reads.
  return h_->epoch.fetch_add(1, std::memory_order_seq_cst) + 1;
}

bool ClaimOwner::quiescent(uint64_t epoch,
                            const std::function<LockState(uint32_t)>& liveness) const {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (uint32_t w = 0; w < kClaimWriters; ++w) {
    const uint64_t a = h_->writers[w].announced_epoch.load(std::memory_order_seq_cst);
    if (a != 0 && a < epoch && liveness(w) != LockState::kFree) return false;
  }
  return true;
}

}  // namespace kvrelay
