// Fixed-record ring in shared memory: one producer process (any of its
// threads), one consumer process. The hot path between two processes (layer
// signals, worker reports).
//
// Each slot carries a sequence number next to its record (Vyukov's bounded
// queue, with one consumer):
//
//   slot.sequence == i                 free for the record with index i
//   slot.sequence == i + 1             holds record i, ready for the consumer
//   slot.sequence == (i + 1) | filler  nothing to read at i (see takeover)
//   consumer, after reading:           slot.sequence = i + capacity (free next lap)
//
// A producer claims index i by CAS on its process-local next index, copies
// the record and publishes it with a CAS of the sequence from i to i + 1, so
// a push or pop touches only the slot itself plus its own side's index;
// neither side reads the other side's index on the hot path. Index-based
// rings (Boost.Lockfree, rigtorp's SPSCQueue with its index caches) bounce
// the index cache lines between the two cores whenever the consumer keeps up;
// this one moves only the slot lines, which must move anyway.
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
//    hole while no producer holds the lease steps over it too.
//  - consumer side: a slot already freed for the next lap at the consumer's
//    position means its predecessor died between freeing it and moving the
//    index: the consumer moves on.
//
// Indices are 64-bit and never wrap; the slot is `index & mask`, so a
// corrupted index or sequence can produce wrong records but never an
// out-of-bounds access.
//
// Blocking calls spin briefly and then park on a futex (WaitEvent); a push
// makes a wake-up system call only when the consumer is parked.
//
// Who may call what: the threads of the one process that leased the producer
// push, through its SpscProducer; exactly one consumer process pops, through
// one SpscRing object; anyone may read the statistics.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "shm/bits.h"
#include "shm/chaos.h"
#include "shm/clock.h"
#include "shm/fault_point.h"
#include "shm/owner_lock.h"
#include "shm/result.h"
#include "shm/wait_event.h"

namespace kvrelay {

struct SpscRingHeader {
  // Geometry: written by the segment creator before the segment is published,
  // read-only afterwards.
  uint32_t record_bytes;
  uint32_t slot_bytes;  // spsc_slot_bytes(record_bytes)
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

// A slot is the 8-byte sequence plus the record. Up to a cache line it is
// padded to a power of two, so that no slot straddles two lines; beyond, to
// a multiple of 8 (padding to whole lines measured slower: it moves more
// lines per record). Records of 56 bytes fill a line exactly.
constexpr uint32_t spsc_slot_bytes(uint32_t record_bytes) {
  const uint64_t need = 8 + uint64_t{record_bytes};
  if (need > 64) return static_cast<uint32_t>(align_up(need, 8));
  uint64_t slot = 8;
  while (slot < need)
    slot *= 2;
  return static_cast<uint32_t>(slot);
}
constexpr size_t spsc_region_bytes(uint32_t capacity, uint32_t record_bytes) {
  return sizeof(SpscRingHeader) + size_t{capacity} * spsc_slot_bytes(record_bytes);
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
  // Consumer, when nothing is readable at `r`: steps over a hole a dead
  // producer left (no lease held, a later record published). True if it did.
  bool step_over_dead_hole(uint64_t r);

  SpscRingHeader* h = nullptr;
  std::byte* slots = nullptr;
  uint64_t capacity = 0;
  uint64_t mask = 0;
  uint32_t slot_bytes = 0;
  LockSpace locks;
  // Consumer-local.
  uint64_t next_read = 0;
  bool read_known = false;
  uint64_t hole_at = UINT64_MAX;
  uint64_t hole_since_ns = 0;

  std::atomic<uint64_t>& sequence(uint64_t index) const {
    return *reinterpret_cast<std::atomic<uint64_t>*>(slots + (index & mask) * slot_bytes);
  }
  std::byte* record(uint64_t index) const { return slots + (index & mask) * slot_bytes + 8; }
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
      std::atomic<uint64_t>& seq = c_.sequence(r);
      const uint64_t s = seq.load(std::memory_order_acquire);
      if (s == r + 1) {
        KVRELAY_CHAOS_POINT();
        std::memcpy(&out, c_.record(r), sizeof(T));
        KVRELAY_CHAOS_POINT();
        seq.store(r + c_.capacity, std::memory_order_release);  // free for the next lap
        KVRELAY_FAULT_POINT("spsc.popped");
        advance(r + 1);
        notify_waiters(c_.h->not_full);
        return true;
      }
      if (s == ((r + 1) | SpscCore::kFiller)) {  // nothing to read here
        seq.store(r + c_.capacity, std::memory_order_release);
        advance(++r);
        continue;
      }
      if (s == r + c_.capacity) {  // freed by a consumer that died before moving on
        advance(++r);
        continue;
      }
      if (s == r) {  // empty, or a claim not published yet
        if (!c_.step_over_dead_hole(r)) return false;
        r = c_.next_read;
        continue;
      }
      // No state a producer or consumer leaves: somebody wrote over the slot.
      c_.h->corrupt_events.fetch_add(1, std::memory_order_relaxed);
      seq.store(r + c_.capacity, std::memory_order_release);
      advance(++r);
    }
    return false;
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
    return c_.sequence(r).load(std::memory_order_acquire) != r;
  }

  // Copies up to `max_records` waiting records without consuming them (for
  // observers such as kvrelay-dump). A record the consumer takes while it is
  // being copied is dropped and the walk stops.
  std::vector<T> peek(size_t max_records) const {
    std::vector<T> out;
    const uint64_t r = c_.h->read_index.load(std::memory_order_acquire);
    for (uint64_t i = r; out.size() < max_records && i - r < c_.capacity; ++i) {
      const uint64_t s = c_.sequence(i).load(std::memory_order_acquire);
      if (s == ((i + 1) | SpscCore::kFiller)) continue;
      if (s != i + 1) break;
      T copy;
      std::memcpy(&copy, c_.record(i), sizeof(T));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (c_.sequence(i).load(std::memory_order_relaxed) != i + 1) break;
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
// concurrently (claims are a CAS on a process-local index). Pushing allocates
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
    std::atomic<uint64_t>& next = *next_;
    uint64_t w = next.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t s = c_.sequence(w).load(std::memory_order_acquire);
      if (s == w) {
        if (next.compare_exchange_weak(w, w + 1, std::memory_order_relaxed)) break;
        continue;  // another thread of ours took it; w was reloaded
      }
      if (static_cast<int64_t>((s & ~SpscCore::kFiller) - w) <= 0) {
        c_.h->full_events.fetch_add(1, std::memory_order_relaxed);  // not yet freed by the consumer
        return false;
      }
      // The slot is ahead of w: another of our threads took it (and moved
      // `next` on), or somebody wrote over it, which we step over.
      const uint64_t now = next.load(std::memory_order_relaxed);
      if (now != w) {
        w = now;
      } else if (next.compare_exchange_weak(w, w + 1, std::memory_order_relaxed)) {
        c_.h->corrupt_events.fetch_add(1, std::memory_order_relaxed);
        ++w;
      }
    }
    KVRELAY_CHAOS_POINT();
    std::memcpy(c_.record(w), &record, sizeof(T));
    KVRELAY_CHAOS_POINT();
    KVRELAY_FAULT_POINT("spsc.written");
    // A plain store: only this thread writes slot w until the consumer frees
    // it. The consumer steps over an unpublished slot (and a successor fills
    // it) only once our lease lock is free, that is, once we are dead.
    c_.sequence(w).store(w + 1, std::memory_order_release);
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
            const uint64_t w = next_->load(std::memory_order_relaxed);
            return c_.sequence(w).load(std::memory_order_acquire) == w;
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
  SpscProducer(SpscCore core, uint64_t next)
      : c_(std::move(core)), next_(std::make_unique<std::atomic<uint64_t>>(next)), leased_(true) {}
  SpscCore c_;
  std::unique_ptr<std::atomic<uint64_t>> next_;
  bool leased_ = false;
};

template <class T>
Result<SpscProducer<T>> SpscRing<T>::lease_producer() const {
  Result<uint64_t> next = c_.lease_producer();
  if (!next) return next.error();
  return SpscProducer<T>(c_, *next);
}

}  // namespace kvrelay
