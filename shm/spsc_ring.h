// Fixed-record ring in shared memory: one producer process (any of its
// threads), one consumer process. The hot path between two processes (layer
// signals, worker reports).
//
// Each slot has two state words, kept apart from the records (Vyukov's
// bounded queue with one consumer, its sequence split in two):
//
//   published[slot] == i + 1            holds record i, ready for the consumer
//   published[slot] == (i + 1) | filler nothing to read at i (see takeover)
//   published[slot] == i + 1 - capacity not yet (the previous lap's value)
//   freed[slot]     == i                free for the record with index i
//   consumer, after reading record i:   freed[slot] = i + capacity
//
// A producer claims index i on its process-local next index (a plain store
// while one thread pushes, a CAS once several do: SpscProducer::Claims) once
// freed[slot] says the slot is free for i, copies the record and publishes
// it by storing published[slot]. Each word has one writer: the producer
// writes records and `published`, the consumer writes `freed`. So a push or
// pop moves the record's line one way, and the state words eight slots to a
// line, one way each; nothing moves back and forth per record. (With one
// sequence word next to the record, the consumer's "freed" store pulled the
// record's line back to its core after every pop, and a 64-byte record plus
// its word straddled two lines.) Neither side reads the other side's index
// on the hot path.
//
// The indices in shared memory are mirrors, written after each push and pop,
// for observers (kvrelay-dump) and for a process taking a side over; neither
// side trusts them on the hot path, so a process that overwrites them changes
// nothing (the consumer restores its mirror). A process killed anywhere in a
// push or a pop leaves the ring usable:
//  - producer side: the producer process holds an owner lock (owner_lock.h)
//    for as long as it produces; a new producer takes over with
//    lease_producer(), which starts after the last published record and
//    marks the slots its dead predecessor claimed but never published as
//    fillers, which the consumer steps over. A consumer waiting at such a
//    hole while no producer holds the lease marks it a filler itself.
//  - consumer side: `freed` is the consumer's commit (one store). A slot
//    already freed at the consumer's position means its predecessor died
//    between freeing it and moving the index: the consumer moves on. Where
//    the consumer is, after a takeover, is read from the `freed` words.
//
// Indices are 64-bit and never wrap; the slot is `index & mask`, so a
// corrupted index or state word can produce wrong records but never an
// out-of-bounds access.
//
// Blocking calls spin briefly and then park on a futex (WaitEvent); a push
// makes a wake-up system call only when the consumer is parked.
//
// Who may call what: the threads of the one process that leased the producer
// push, through its SpscProducer; exactly one consumer process pops, through
// one SpscRing object; anyone may read the statistics.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "shm/asymmetric_fence.h"
#include "shm/bits.h"
#include "shm/chaos.h"
#include "shm/clock.h"
#include "shm/fault_point.h"
#include "shm/futex.h"
#include "shm/owner_lock.h"
#include "shm/result.h"
#include "shm/wait_event.h"

namespace kvrelay {

struct SpscRingHeader {
  // Geometry: written by the segment creator before the segment is published,
  // read-only afterwards.
  uint32_t record_bytes;
  uint32_t slot_bytes;  // spsc_region_layout(capacity, record_bytes).slot_bytes
  uint32_t capacity;    // records; a power of two
  uint8_t reserved0[52];

  // Producer's line.
  alignas(64) std::atomic<uint64_t> write_index;  // mirror of the producer's next index
  std::atomic<uint64_t> full_events;              // pushes that found the ring full
  std::atomic<uint32_t> producer_pid;             // the leaser, for people (never trusted)
  std::atomic<uint32_t> producer_generation;      // bumped by each lease
  uint8_t reserved1[40];

  // Consumer's line.
  alignas(64) std::atomic<uint64_t> read_index;  // mirror of the consumer's next index
  std::atomic<uint64_t> skipped_records;         // dead producers' unpublished claims stepped over
  std::atomic<uint64_t> corrupt_events;          // mirror overwritten by somebody else
  uint8_t reserved2[40];

  WaitEvent not_empty;  // the consumer parks here
  WaitEvent not_full;   // the producer parks here
  // Its first byte's owner lock is the producer lease.
  alignas(64) uint8_t producer_lock[64];
};
static_assert(std::is_standard_layout_v<SpscRingHeader>);
static_assert(sizeof(SpscRingHeader) == 384);
static_assert(offsetof(SpscRingHeader, write_index) == 64);
static_assert(offsetof(SpscRingHeader, read_index) == 128);
static_assert(offsetof(SpscRingHeader, not_empty) == 192);
static_assert(offsetof(SpscRingHeader, producer_lock) == 320);

// Where the parts of a ring lie in its region, as offsets from its start.
// A record that fits a cache line with its 8-byte `published` word shares a
// slot with it, the word first, the slot padded to a power of two so that
// none straddles two lines (records of 56 bytes fill a line exactly): the
// consumer's one look at the line then brings both. A larger record gets a
// slot of its own (a 64-byte record exactly one line, beyond that a multiple
// of 8: padding to whole lines measured slower, it moves more lines per
// record), and the `published` words an array of their own. The `freed`
// words, which only the consumer writes, always have their own array.
struct SpscRegionLayout {
  uint32_t slot_bytes;        // stride of the slot array
  uint32_t published_stride;  // bytes from one `published` word to the next
  size_t slots;
  size_t published;  // the first `published` word
  size_t records;    // the first record
  size_t freed;      // the `freed` words, 8 bytes each
  size_t end;
};
constexpr SpscRegionLayout spsc_region_layout(uint32_t capacity, uint32_t record_bytes) {
  SpscRegionLayout l{};
  l.slots = sizeof(SpscRingHeader);
  const uint64_t with_word = 8 + uint64_t{record_bytes};
  size_t after_slots = 0;
  if (with_word <= 64) {
    uint64_t slot = 16;
    while (slot < with_word)
      slot *= 2;
    l.slot_bytes = static_cast<uint32_t>(slot);
    l.published_stride = l.slot_bytes;
    l.published = l.slots;
    l.records = l.slots + 8;
    after_slots = align_up(l.slots + size_t{capacity} * l.slot_bytes, 64);
  } else {
    l.slot_bytes = static_cast<uint32_t>(align_up(uint64_t{record_bytes}, 8));
    l.published_stride = 8;
    l.records = l.slots;
    l.published = align_up(l.slots + size_t{capacity} * l.slot_bytes, 64);
    after_slots = align_up(l.published + size_t{capacity} * 8, 64);
  }
  l.freed = after_slots;
  l.end = align_up(l.freed + size_t{capacity} * 8, 64);
  return l;
}
constexpr size_t spsc_region_bytes(uint32_t capacity, uint32_t record_bytes) {
  return spsc_region_layout(capacity, record_bytes).end;
}

// Untyped set-up, for a creator that knows the record size but not the type
// (the control segment). Creator only, on zeroed memory, before publication.
Status initialize_spsc_region(void* region, size_t region_bytes, uint32_t capacity,
                              uint32_t record_bytes);

// The untyped parts of a ring: geometry, lease and takeover, hole handling.
class SpscCore {
 public:
  static constexpr uint64_t kFiller = uint64_t{1} << 63;
  static Result<SpscCore> attach(void* region, size_t region_bytes, size_t record_bytes,
                                 LockSpace locks);

  // Producer lease: the owner lock, then the takeover described at the top.
  // Returns the index the new producer continues from.
  Result<uint64_t> lease_producer() const;
  void release_producer() const;

  // Consumer: the index to continue from (our own copy; the mirror restored
  // from it when somebody else wrote it).
  uint64_t consumer_index();
  // Consumer, when nothing is readable at `r` (`published` holds `p`): marks
  // a hole a dead producer left (no lease held, a later record published) as
  // a filler. True if it did.
  bool step_over_dead_hole(uint64_t r, uint64_t p);

  SpscRingHeader* h = nullptr;
  std::byte* published_words = nullptr;
  std::byte* records = nullptr;
  std::atomic<uint64_t>* freed_words = nullptr;
  uint64_t capacity = 0;
  uint64_t mask = 0;
  uint32_t slot_bytes = 0;
  uint32_t published_stride = 0;
  uint64_t published_per_line = 0;
  LockSpace locks;
  // Consumer-local.
  uint64_t next_read = 0;
  bool read_known = false;
  uint64_t hole_at = UINT64_MAX;
  uint64_t hole_since_ns = 0;
  // Records below this index were seen published (acquire loads, a line of
  // `published` words at a time), so try_pop need not load their words again.
  uint64_t published_end = 0;

  // The slot's state words and record for ring index `index`.
  std::atomic<uint64_t>& published(uint64_t index) const {
    return *reinterpret_cast<std::atomic<uint64_t>*>(published_words +
                                                     (index & mask) * published_stride);
  }
  std::atomic<uint64_t>& freed(uint64_t index) const { return freed_words[index & mask]; }
  std::byte* record(uint64_t index) const { return records + (index & mask) * slot_bytes; }
  // One past the last index whose `published` (or `freed`) word shares the
  // cache line of index's, within the same lap.
  uint64_t published_line_end(uint64_t index) const {
    return std::min((index | (published_per_line - 1)) + 1, index + capacity);
  }
  uint64_t freed_line_end(uint64_t index) const {
    return std::min((index | 7) + 1, index + capacity);
  }
  // What `published` holds at `index` before the record is published: the
  // previous lap's record or filler. (In the first lap, index + 1 - capacity
  // wraps below zero and has the filler bit set already; it is never a
  // filler there.)
  bool unpublished(uint64_t index, uint64_t p) const {
    const uint64_t previous = index + 1 - capacity;
    return p == previous || p == (previous | kFiller);
  }
  // Whether `published` holding `p` at `index` says this lap's record, or a
  // filler in its place, is there.
  static bool written(uint64_t index, uint64_t p) {
    return p == index + 1 || p == ((index + 1) | kFiller);
  }
};

template <class T>
class SpscProducer;

template <class T>
class SpscRing {
  static_assert(std::is_trivially_copyable_v<T>, "records are copied between processes as bytes");
  static_assert(alignof(T) <= 8, "slots are 8-byte aligned");

 public:
  static constexpr size_t bytes_for(uint32_t capacity) {
    return spsc_region_bytes(capacity, sizeof(T));
  }

  // Creator only, on zeroed memory, before anyone else can see it.
  static Status initialize(void* region, size_t region_bytes, uint32_t capacity) {
    return initialize_spsc_region(region, region_bytes, capacity, sizeof(T));
  }

  // Validates the header before trusting it (the region is another
  // process's). `locks`: where the producer lease lives (the segment's file
  // at the region's offset).
  static Result<SpscRing> attach(void* region, size_t region_bytes, LockSpace locks = {}) {
    Result<SpscCore> core = SpscCore::attach(region, region_bytes, sizeof(T), locks);
    if (!core) return core.error();
    return SpscRing(std::move(core).value());
  }

  // Takes the producer side for this process (see the top). kBusy when
  // another live process holds it.
  Result<SpscProducer<T>> lease_producer() const;

  // Consumer. Returns false when no record waits.
  [[nodiscard]] bool try_pop(T& out) noexcept {
    uint64_t r = c_.consumer_index();
    for (uint64_t steps = 0; steps <= c_.capacity; ++steps) {
      const uint64_t p = r < c_.published_end ? r + 1 : scan_published(r);
      const bool record = p == r + 1;
      if (SpscCore::written(r, p)) {
        std::atomic<uint64_t>& freed = c_.freed(r);
        const uint64_t f = freed.load(std::memory_order_relaxed);  // only we write it
        if (f == r + c_.capacity) {  // freed by a consumer that died before moving on
          advance(++r);
          continue;
        }
        if (f != r) c_.h->corrupt_events.fetch_add(1, std::memory_order_relaxed);
        if (record) {
          KVRELAY_CHAOS_POINT();
          std::memcpy(&out, c_.record(r), sizeof(T));
          KVRELAY_CHAOS_POINT();
        }
        freed.store(r + c_.capacity, std::memory_order_release);  // free for the next lap
        if (!record) {  // a filler: nothing to read here
          advance(++r);
          continue;
        }
        KVRELAY_FAULT_POINT("spsc.popped");
        advance(r + 1);
        notify_waiters(c_.h->not_full);
        return true;
      }
      if (c_.unpublished(r, p)) {  // empty, or a claim not published yet
        if (!c_.step_over_dead_hole(r, p)) return false;
        continue;  // it is a filler now
      }
      // No state a producer leaves: somebody wrote over the slot.
      c_.h->corrupt_events.fetch_add(1, std::memory_order_relaxed);
      c_.freed(r).store(r + c_.capacity, std::memory_order_release);
      advance(++r);
    }
    return false;
  }

  // Consumer: loads `published` at r and, if it holds a record, the words
  // after it in the same line, so that a run of records costs the consumer
  // one look at the line the producer is writing rather than one per record.
  uint64_t scan_published(uint64_t r) noexcept {
    const uint64_t p = c_.published(r).load(std::memory_order_acquire);
    if (p != r + 1) return p;
    uint64_t end = r + 1;
    for (const uint64_t limit = c_.published_line_end(r); end < limit; ++end)
      if (c_.published(end).load(std::memory_order_acquire) != end + 1) break;
    c_.published_end = end;
    return p;
  }

  // Consumer. Waits for a record until `deadline`; kTimeout if none came.
  Status pop(T& out, Deadline deadline) {
    if (try_pop(out)) return {};
    const bool any = wait_until(
        c_.h->not_empty, [&] { return readable(); }, deadline);
    if (any && try_pop(out)) return {};
    return make_error(Errc::kTimeout, "spsc ring empty until the deadline");
  }

  // Consumer: whether try_pop has something to do (a record, a filler, or a
  // slot to step over). A claimed but unpublished slot does not count.
  bool readable() const {
    const uint64_t r =
        c_.read_known ? c_.next_read : c_.h->read_index.load(std::memory_order_acquire);
    return !c_.unpublished(r, c_.published(r).load(std::memory_order_acquire));
  }

  // Copies up to `max_records` waiting records without consuming them (for
  // observers such as kvrelay-dump). A record the consumer takes while it is
  // being copied is dropped and the walk stops.
  std::vector<T> peek(size_t max_records) const {
    std::vector<T> out;
    const uint64_t r = c_.h->read_index.load(std::memory_order_acquire);
    for (uint64_t i = r; out.size() < max_records && i - r < c_.capacity; ++i) {
      const uint64_t p = c_.published(i).load(std::memory_order_acquire);
      if (p == ((i + 1) | SpscCore::kFiller)) continue;
      if (p != i + 1) break;
      T copy;
      std::memcpy(&copy, c_.record(i), sizeof(T));
      std::atomic_thread_fence(std::memory_order_acquire);
      // Taken while we copied: its slot was freed, and may be written again.
      if (c_.freed(i).load(std::memory_order_relaxed) != i) break;
      out.push_back(copy);
    }
    return out;
  }

  // Records waiting, from the mirrors; a snapshot that may be stale by the
  // time it returns.
  uint64_t size() const {
    const uint64_t r = c_.h->read_index.load(std::memory_order_acquire);
    const uint64_t w = c_.h->write_index.load(std::memory_order_acquire);
    return w >= r ? std::min<uint64_t>(w - r, c_.capacity) : 0;
  }
  uint32_t capacity() const { return static_cast<uint32_t>(c_.capacity); }
  const SpscRingHeader& header() const { return *c_.h; }
  // Consumer: the ring index of the next record (so the last one popped is
  // one below it).
  uint64_t consumer_position() const { return c_.next_read; }
  // Whether a live process holds the producer lease.
  LockState producer_liveness() const {
    return c_.locks.probe(offsetof(SpscRingHeader, producer_lock));
  }

 private:
  explicit SpscRing(SpscCore core) : c_(std::move(core)) {}
  void advance(uint64_t next) noexcept {
    c_.next_read = next;
    c_.h->read_index.store(next, std::memory_order_relaxed);
  }
  SpscCore c_;
};

// The producer side of a ring, leased by one process; its threads may push
// concurrently (claims on a process-local index, biased to the first thread
// that pushes: see Claims). Pushing allocates
// nothing, takes no lock and makes a system call only to wake a parked
// consumer, so it may run in a CUDA host callback.
template <class T>
class SpscProducer {
 public:
  SpscProducer(SpscProducer&& o) noexcept
      : c_(o.c_), next_(std::move(o.next_)), leased_(std::exchange(o.leased_, false)) {}
  SpscProducer& operator=(SpscProducer&& o) noexcept {
    if (this != &o) {
      release();
      c_ = o.c_;
      next_ = std::move(o.next_);
      leased_ = std::exchange(o.leased_, false);
    }
    return *this;
  }
  SpscProducer(const SpscProducer&) = delete;
  SpscProducer& operator=(const SpscProducer&) = delete;
  ~SpscProducer() { release(); }

  // Returns false, and counts a full event, when the ring is full.
  [[nodiscard]] bool try_push(const T& record) noexcept {
    Claims& claims = *next_;
    const bool exclusive = enter_exclusive(claims);
    uint64_t w = 0;
    const bool claimed = claim(claims, exclusive, w);
    if (exclusive) claims.owner_busy.store(false, std::memory_order_release);
    if (!claimed) return false;
    KVRELAY_CHAOS_POINT();
    std::memcpy(c_.record(w), &record, sizeof(T));
    KVRELAY_CHAOS_POINT();
    KVRELAY_FAULT_POINT("spsc.written");
    // A plain store: only this thread writes slot w until the consumer frees
    // it. The consumer steps over an unpublished slot (and a successor fills
    // it) only once our lease lock is free, that is, once we are dead.
    c_.published(w).store(w + 1, std::memory_order_release);
    // The mirror is for inspection only: a load and a store rather than a
    // read-modify-write on every push. Threads racing here may leave it a
    // few records behind until the next push.
    if (c_.h->write_index.load(std::memory_order_relaxed) < w + 1)
      c_.h->write_index.store(w + 1, std::memory_order_relaxed);
    notify_waiters(c_.h->not_empty);
    return true;
  }

  // Waits for room until `deadline`; kTimeout if none appeared.
  Status push(const T& record, Deadline deadline) {
    for (;;) {
      if (try_push(record)) return {};
      const bool room = wait_until(
          c_.h->not_full,
          [&] {
            const uint64_t w = next_->index.load(std::memory_order_relaxed);
            return c_.freed(w).load(std::memory_order_acquire) == w;
          },
          deadline);
      if (!room) return make_error(Errc::kTimeout, "spsc ring full until the deadline");
    }
  }

  // Lets the producer side go (also done by the destructor).
  void release() {
    if (leased_) c_.release_producer();
    leased_ = false;
  }

 private:
  friend class SpscRing<T>;
  // Process-local claim state, shared by the threads that push.
  //
  // Claims are biased to the first thread that pushes: while it is the only
  // one, it claims with plain loads and stores. A CAS on every claim was the
  // ring's bottleneck: a locked instruction drains the store buffer, so each
  // push waited for the previous record's line to come back from the
  // consumer's core (a third of the throughput, or less).
  //
  // The first other thread to push revokes the bias for good: it moves
  // `owner` to kRevoking (one revoker wins), runs a Dekker handshake on
  // `owner` and `owner_busy` with asymmetric fences (the owner's side is a
  // compiler barrier, the revoker's a membarrier, once), waits for a claim
  // the owner may be in the middle of, and only then sets kShared. From then
  // on every thread claims by CAS. Threads that find kRevoking wait for
  // kShared: a CAS claim while the owner may still take an index with a
  // plain store would hand one index to two threads (with three threads
  // pushing, that lost records until the revocation had its own state).
  static constexpr uintptr_t kUnowned = 0;
  static constexpr uintptr_t kShared = ~uintptr_t{0};
  static constexpr uintptr_t kRevoking = ~uintptr_t{1};
  struct Claims {
    explicit Claims(uint64_t next) : index(next), free_end(next) {}
    std::atomic<uint64_t> index;     // the next index to claim
    std::atomic<uint64_t> free_end;  // indices below it were seen free (acquire loads)
    // kUnowned -> the biased thread's token -> kRevoking -> kShared, never back.
    std::atomic<uintptr_t> owner{kUnowned};
    std::atomic<bool> owner_busy{false};  // the owner is inside a claim
  };

  // A token of the calling thread, never kUnowned, kRevoking or kShared. (A
  // thread that ends may pass its token on to a later one; it claims nothing
  // by then.)
  static uintptr_t this_thread_token() noexcept {
    static thread_local char token;
    return reinterpret_cast<uintptr_t>(&token);
  }

  // Spins, then yields: the thread waited for may have been preempted.
  template <class Done>
  static void wait_for(Done&& done) noexcept {
    for (uint32_t spins = 0; !done(); ++spins) {
      if (spins < 1024) {
        cpu_relax();
      } else {
        detail::yield_cpu();
      }
    }
  }

  // True when the calling thread holds the bias: it may claim with plain
  // stores, and must clear owner_busy after its claim. False: claim by CAS.
  static bool enter_exclusive(Claims& claims) noexcept {
    uintptr_t owner = claims.owner.load(std::memory_order_acquire);
    if (owner == kShared) return false;
    const uintptr_t self = this_thread_token();
    if (owner == kUnowned &&
        claims.owner.compare_exchange_strong(owner, self, std::memory_order_relaxed))
      owner = self;  // the first thread to push takes the bias
    if (owner == self) {
      claims.owner_busy.store(true, std::memory_order_relaxed);
      light_fence();  // pairs with the revoker's heavy_fence
      if (claims.owner.load(std::memory_order_relaxed) == self) return true;
      // Being revoked: the revoker waits for this store, and nobody claims
      // with plain stores any more, so a CAS claim is safe from here on.
      claims.owner_busy.store(false, std::memory_order_release);
      return false;
    }
    if (owner != kRevoking &&
        claims.owner.compare_exchange_strong(owner, kRevoking, std::memory_order_relaxed)) {
      // After heavy_fence the owner either sees kRevoking on its re-check,
      // or its owner_busy store is seen here.
      (void)heavy_fence();  // without membarrier: a full fence, and so is light_fence
      wait_for([&] { return !claims.owner_busy.load(std::memory_order_acquire); });
      claims.owner.store(kShared, std::memory_order_release);
      return false;
    }
    // Another thread is revoking the bias (or just did): wait until the owner
    // is out of its last plain claim.
    wait_for([&] { return claims.owner.load(std::memory_order_acquire) == kShared; });
    return false;
  }

  // Claims the next index (into `w`) once its slot is free. `exclusive`:
  // no other thread claims, so a plain store takes the index.
  bool claim(Claims& claims, bool exclusive, uint64_t& w) noexcept {
    std::atomic<uint64_t>& next = claims.index;
    std::atomic<uint64_t>& free_end = claims.free_end;
    auto take = [&] {
      if (!exclusive) return next.compare_exchange_weak(w, w + 1, std::memory_order_relaxed);
      KVRELAY_CHAOS_POINT();  // widens the window a revoking thread must not slip into
      next.store(w + 1, std::memory_order_relaxed);
      return true;
    };
    w = next.load(std::memory_order_relaxed);
    for (;;) {
      if (w < free_end.load(std::memory_order_acquire)) {  // seen free already
        if (take()) return true;
        continue;  // another thread of ours took it; w was reloaded
      }
      const uint64_t f = c_.freed(w).load(std::memory_order_acquire);
      if (f == w) {
        // Free, and maybe the slots after it in the same line: remember how
        // far, so the next pushes need not look at the consumer's line.
        uint64_t end = w + 1;
        for (const uint64_t limit = c_.freed_line_end(w); end < limit; ++end)
          if (c_.freed(end).load(std::memory_order_acquire) != end) break;
        free_end.store(
            end, std::memory_order_release);  // a racing thread's smaller end only costs a look
        if (take()) return true;
        continue;  // another thread of ours took it; w was reloaded
      }
      if (static_cast<int64_t>(f - w) < 0) {
        c_.h->full_events.fetch_add(1, std::memory_order_relaxed);  // not yet freed by the consumer
        return false;
      }
      // The slot is free for a later lap: another of our threads took w and
      // the consumer has read it (and `next` moved on), or somebody wrote
      // over it, which we step over.
      const uint64_t now = next.load(std::memory_order_relaxed);
      if (now != w) {
        w = now;
      } else if (take()) {
        c_.h->corrupt_events.fetch_add(1, std::memory_order_relaxed);
        ++w;
      }
    }
  }
  SpscProducer(SpscCore core, uint64_t next)
      : c_(std::move(core)), next_(std::make_unique<Claims>(next)), leased_(true) {}
  SpscCore c_;
  std::unique_ptr<Claims> next_;
  bool leased_ = false;
};

template <class T>
Result<SpscProducer<T>> SpscRing<T>::lease_producer() const {
  Result<uint64_t> next = c_.lease_producer();
  if (!next) return next.error();
  return SpscProducer<T>(c_, *next);
}

}  // namespace kvrelay
