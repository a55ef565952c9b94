// Claims on the blocks of a pool that other processes write into directly
// (the ipc transport writes a decode rank's pool from the prefill worker),
// so that the pool's owner can say which keyed claim may be written where,
// and can tell when nobody is still writing under a claim it ended.
//
//   owner:   one process (the decode rank's worker). open(key, blocks)
//            claims blocks for a key; close(key) ends the claim, frees its
//            blocks, and returns the epoch writers must have passed before
//            the owner may answer that nothing more lands there.
//   writers: any processes, each through the writer slot of its producer
//            lease on the owner's landed ring (so the slot's owner lock
//            proves the writer alive). Before looking at the table a writer
//            announces the oldest epoch it read among its writes in
//            progress; it clears the announcement once they are done.
//
// Why the announcement makes close() safe (epoch-based reclamation): close
// stores the entry's new state, then increments the epoch to E; a writer
// stores its announcement, then reads the entry, all seq_cst. Either the
// writer read the epoch after the increment (it announced >= E and it sees
// the entry closed), or its announcement (< E) is visible to the owner's
// quiescent(E), which waits for it to clear or for the writer to die.
//
// Entries are found by key (open addressing, kClaimProbe places from the
// key's hash) and rewritten under a sequence lock; each block names the
// entry that claims it (index + 1). A closed entry keeps refusing its key
// for kClaimRememberNs, then becomes reusable. The table is input to its
// writers and to the owner alike: the owner keeps its own copy of its
// claims and never reads its decisions back from here.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "shm/mpsc_ring.h"
#include "shm/owner_lock.h"
#include "shm/result.h"

namespace kvrelay {

inline constexpr uint32_t kClaimEntries = 4096;  // a power of two
inline constexpr uint32_t kClaimProbe = 16;
inline constexpr uint32_t kClaimWriters = kMpscProducerSlots;
inline constexpr uint64_t kClaimRememberNs = 60'000'000'000ull;

enum class ClaimState : uint32_t { kFree = 0, kOpen = 1, kClosed = 2 };

struct ClaimEntry {
  std::atomic<uint32_t> sequence;  // odd while the owner rewrites the entry
  std::atomic<uint32_t> state;     // ClaimState
  std::atomic<uint64_t> key;
  std::atomic<uint64_t> closed_at_ns;  // CLOCK_MONOTONIC
  uint64_t reserved;
};
static_assert(sizeof(ClaimEntry) == 32);

struct alignas(64) ClaimWriterSlot {
  // 0: not writing; else the oldest epoch among the writer's writes in
  // progress. Written by the writer that holds the slot's lease.
  std::atomic<uint64_t> announced_epoch;
  uint8_t reserved[56];
};
static_assert(sizeof(ClaimWriterSlot) == 64);

struct ClaimTableHeader {
  std::atomic<uint64_t> epoch;  // the owner's; starts at 1 and only grows
  // 1 once anybody may claim blocks here (set before the first claim is
  // asked for, by whoever asks): until then writers skip the table and say
  // nothing of what they wrote, so that the path of those who never claim
  // costs one load.
  std::atomic<uint32_t> in_use;
  uint8_t reserved[52];
  ClaimWriterSlot writers[kClaimWriters];
  ClaimEntry entries[kClaimEntries];
  // Followed by std::atomic<uint32_t> claim[blocks]: entry index + 1, 0: unclaimed.
};
static_assert(std::is_standard_layout_v<ClaimTableHeader>);
static_assert(offsetof(ClaimTableHeader, writers) == 64);

constexpr size_t claim_table_bytes(uint32_t blocks) {
  return sizeof(ClaimTableHeader) + size_t{blocks} * sizeof(std::atomic<uint32_t>);
}
// Creator only, on zeroed memory.
void initialize_claim_table(std::span<std::byte> region);
// The entry where a key's probe window starts.
uint32_t claim_home(uint64_t key);
// Marks the table in use (see ClaimTableHeader::in_use); any process.
void mark_claim_table_in_use(std::span<std::byte> region);

// What a writer finds for a key.
struct ClaimLookup {
  ClaimState state = ClaimState::kFree;  // kFree: no claim (or one long closed)
  uint32_t entry = 0;                      // when kOpen or kClosed
};

// The writer's side (any process; not thread-safe: one per writer slot).
class ClaimWriterView {
 public:
  // `region` must be at least claim_table_bytes(blocks) (checked by the caller).
  ClaimWriterView(std::span<std::byte> region, uint32_t blocks, uint32_t writer);

  // Announces that a write starts under the current epoch, unless an older
  // announcement (of a write still in progress) stands: `held` is that
  // older epoch or 0. Returns the current epoch, which this write's
  // announcement may later be raised to. seq_cst: the lookups that follow
  // are ordered after it.
  uint64_t announce(uint64_t held);
  // The writes in progress now hold `oldest` (0: none).
  void set_announcement(uint64_t oldest);

  // Whether anybody may claim blocks here yet: when not, writers need not
  // look or tell (acquire: claims made after the mark are seen).
  bool in_use() const { return h_->in_use.load(std::memory_order_acquire) != 0; }
  ClaimLookup lookup(uint64_t key, uint64_t now_ns) const;
  // The entry index + 1 that claims `block`, 0 when unclaimed (or out of range).
  uint32_t claim_of(uint32_t block) const;
  uint32_t blocks() const { return blocks_; }

 private:
  ClaimTableHeader* h_;
  std::atomic<uint32_t>* claims_;
  uint32_t blocks_;
  uint32_t writer_;
};

// The owner's side (one process, one thread).
class ClaimOwner {
 public:
  ClaimOwner(std::span<std::byte> region, uint32_t blocks);

  // A new owner (a restarted worker): every claim is forgotten, the epoch
  // goes on growing.
  void reset();
  // Claims `blocks` for `key`. Refused when the key holds a claim already,
  // a block is claimed or out of range, or the key's probe window is full of
  // open claims.
  Status open(uint64_t key, std::span<const uint32_t> blocks, uint64_t now_ns);
  // Ends `key`'s claim: its blocks are unclaimed, writers that look from now
  // on find it closed. Returns the epoch quiescent() must be asked about, or
  // 0 when the key held no open claim (a second close).
  uint64_t close(uint64_t key, uint64_t now_ns);
  // Whether every writer that may have admitted a write before the close
  // that returned `epoch` is done or dead. `liveness(w)`: writer slot w's
  // owner lock (kUnknown counts as alive).
  bool quiescent(uint64_t epoch, const std::function<LockState(uint32_t)>& liveness) const;
  uint64_t epoch() const { return h_->epoch.load(std::memory_order_acquire); }
  size_t open_claims() const { return claims_by_key_.size(); }

 private:
  struct Claim {
    uint32_t entry;
    std::vector<uint32_t> blocks;
  };
  void rewrite(uint32_t entry, ClaimState state, uint64_t key, uint64_t closed_at_ns);

  ClaimTableHeader* h_;
  std::atomic<uint32_t>* claims_;
  uint32_t blocks_;
  std::unordered_map<uint64_t, Claim> claims_by_key_;  // our own copy: open claims
  std::vector<uint64_t> entry_key_;                    // our copy of each entry's key
  std::vector<uint64_t> entry_closed_ns_;              // 0: open or free
  std::vector<uint32_t> local_claims_;                 // our copy of each block's claim
};

}  // namespace kvrelay
