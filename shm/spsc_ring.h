// Fixed-record single-producer single-consumer ring in shared memory.
//
// The hot path between two processes (layer signals, worker reports).
//
// Each slot carries a sequence number next to its record (Vyukov's bounded
// queue, reduced to one producer and one consumer):
//
//   slot.sequence == i        slot is free for the record with index i
//   slot.sequence == i + 1    slot holds record i, ready for the consumer
//   consumer, after reading:  slot.sequence = i + capacity (free for the next lap)
//
// So a push or pop touches only the slot itself plus its own side's index;
// neither side reads the other side's index on the hot path. Index-based
// rings (Boost.Lockfree, and rigtorp's SPSCQueue with its index caches)
// bounce the index cache lines between the two cores whenever the consumer
// keeps up with the producer; this one moves only the slot lines, which must
// move anyway. The indices still live in shared memory (each on its own
// cache line) so that a process taking over a side continues where its
// predecessor stopped, and so that kvrelay-dump can show occupancy.
//
// Indices are 64-bit and never wrap; the slot is `index & mask`, so a
// corrupted index or sequence can produce wrong records but never an
// out-of-bounds access.
//
// Blocking calls spin briefly and then park on a futex (WaitEvent); a push
// makes a wake-up system call only when the consumer is parked.
//
// Who may call what: exactly one producer process calls the push functions,
// exactly one consumer process calls the pop functions; anyone may read the
// statistics.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "shm/bits.h"
#include "shm/chaos.h"
#include "shm/clock.h"
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
  alignas(64) std::atomic<uint64_t> write_index;
  std::atomic<uint64_t> full_events;  // pushes that found the ring full
  uint8_t reserved1[48];

  // Consumer's line.
  alignas(64) std::atomic<uint64_t> read_index;
  uint8_t reserved2[56];

  WaitEvent not_empty;  // the consumer parks here
  WaitEvent not_full;   // the producer parks here
};
static_assert(std::is_standard_layout_v<SpscRingHeader>);
static_assert(sizeof(SpscRingHeader) == 320);
static_assert(offsetof(SpscRingHeader, write_index) == 64);
static_assert(offsetof(SpscRingHeader, read_index) == 128);
static_assert(offsetof(SpscRingHeader, not_empty) == 192);

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

namespace spsc_detail {
Status validate(const SpscRingHeader& h, size_t region_bytes, size_t record_bytes);
}  // namespace spsc_detail

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

  // Validates the header before trusting it (the region is another process's).
  static Result<SpscRing> attach(void* region, size_t region_bytes) {
    if (region_bytes < sizeof(SpscRingHeader))
      return make_error(Errc::kCorrupt, "spsc ring region smaller than its header");
    auto* h = static_cast<SpscRingHeader*>(region);
    if (Status s = spsc_detail::validate(*h, region_bytes, sizeof(T)); !s) return s.error();
    return SpscRing(h);
  }

  // Producer. Returns false, and counts a full event, when the ring is full.
  bool try_push(const T& record) {
    const uint64_t w = h_->write_index.load(std::memory_order_relaxed);
    std::byte* s = slot(w);
    if (sequence(s).load(std::memory_order_acquire) != w) {  // not yet freed by the consumer
      h_->full_events.store(h_->full_events.load(std::memory_order_relaxed) + 1,
                            std::memory_order_relaxed);
      return false;
    }
    KVRELAY_CHAOS_POINT();
    std::memcpy(s + 8, &record, sizeof(T));
    KVRELAY_CHAOS_POINT();
    sequence(s).store(w + 1, std::memory_order_release);  // publish the record
    h_->write_index.store(w + 1, std::memory_order_relaxed);
    notify_waiters(h_->not_empty);
    return true;
  }

  // Producer. Waits for room until `deadline`; kTimeout if none appeared.
  Status push(const T& record, Deadline deadline) {
    if (try_push(record)) return {};
    const bool room = wait_until(
        h_->not_full,
        [&] {
          const uint64_t w = h_->write_index.load(std::memory_order_relaxed);
          return sequence(slot(w)).load(std::memory_order_acquire) == w;
        },
        deadline);
    if (room && try_push(record)) return {};
    return make_error(Errc::kTimeout, "spsc ring full until the deadline");
  }

  // Consumer. Returns false when the ring is empty.
  bool try_pop(T& out) {
    const uint64_t r = h_->read_index.load(std::memory_order_relaxed);
    std::byte* s = slot(r);
    if (sequence(s).load(std::memory_order_acquire) != r + 1) return false;
    KVRELAY_CHAOS_POINT();
    std::memcpy(&out, s + 8, sizeof(T));
    KVRELAY_CHAOS_POINT();
    sequence(s).store(r + cap_, std::memory_order_release);  // free for the next lap
    h_->read_index.store(r + 1, std::memory_order_relaxed);
    notify_waiters(h_->not_full);
    return true;
  }

  // Consumer. Waits for a record until `deadline`; kTimeout if none came.
  Status pop(T& out, Deadline deadline) {
    if (try_pop(out)) return {};
    const bool any = wait_until(
        h_->not_empty,
        [&] {
          const uint64_t r = h_->read_index.load(std::memory_order_relaxed);
          return sequence(slot(r)).load(std::memory_order_acquire) == r + 1;
        },
        deadline);
    if (any && try_pop(out)) return {};
    return make_error(Errc::kTimeout, "spsc ring empty until the deadline");
  }

  // Copies up to `max_records` waiting records without consuming them (for
  // observers such as kvrelay-dump). A record the consumer takes while it is
  // being copied is dropped and the walk stops.
  std::vector<T> peek(size_t max_records) const {
    std::vector<T> out;
    const uint64_t r = h_->read_index.load(std::memory_order_acquire);
    for (uint64_t i = r; out.size() < max_records && i - r < cap_; ++i) {
      std::byte* s = slot(i);
      if (sequence(s).load(std::memory_order_acquire) != i + 1) break;
      T copy;
      std::memcpy(&copy, s + 8, sizeof(T));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (sequence(s).load(std::memory_order_relaxed) != i + 1) break;
      out.push_back(copy);
    }
    return out;
  }

  // Records waiting; a snapshot that may be stale by the time it returns.
  uint64_t size() const {
    const uint64_t r = h_->read_index.load(std::memory_order_acquire);
    const uint64_t w = h_->write_index.load(std::memory_order_acquire);
    return w >= r ? w - r : 0;
  }
  uint32_t capacity() const { return static_cast<uint32_t>(cap_); }
  const SpscRingHeader& header() const { return *h_; }

 private:
  explicit SpscRing(SpscRingHeader* h)
      : h_(h),
        slots_(reinterpret_cast<std::byte*>(h) + sizeof(SpscRingHeader)),
        cap_(h->capacity),
        mask_(h->capacity - 1) {}
  static constexpr size_t kSlotBytes = spsc_slot_bytes(sizeof(T));
  std::byte* slot(uint64_t index) const { return slots_ + (index & mask_) * kSlotBytes; }
  static std::atomic<uint64_t>& sequence(std::byte* slot) {
    return *reinterpret_cast<std::atomic<uint64_t>*>(slot);
  }

  SpscRingHeader* h_;
  std::byte* slots_;
  uint64_t cap_;
  uint64_t mask_;
};

}  // namespace kvrelay
