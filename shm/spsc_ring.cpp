#include "shm/spsc_ring.h"

#include <fmt/format.h>

#include <algorithm>
#include <new>

#include "shm/process_identity.h"

namespace kvrelay {

namespace {

// How long a consumer waits at an unpublished claim before it checks whether
// the producer that made it still lives.
constexpr uint64_t kHoleCheckNs = 20'000'000;

constexpr uint64_t kLeaseOffset = offsetof(SpscRingHeader, producer_lock);

}  // namespace

Status initialize_spsc_region(void* region, size_t region_bytes, uint32_t capacity,
                              uint32_t record_bytes) {
  if (!is_pow2(capacity) || capacity < 2)
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("spsc ring capacity {} is not a power of two of at least 2", capacity));
  if (record_bytes == 0)
    return make_error(Errc::kInvalidArgument, "spsc ring record size must be positive");
  if (region_bytes < spsc_region_bytes(capacity, record_bytes))
    return make_error(Errc::kInvalidArgument, "spsc ring region too small for its capacity");
  auto* h = new (region) SpscRingHeader{};
  h->record_bytes = record_bytes;
  const SpscRegionLayout l = spsc_region_layout(capacity, record_bytes);
  h->slot_bytes = l.slot_bytes;
  h->capacity = capacity;
  auto* base = static_cast<std::byte*>(region);
  for (uint64_t i = 0; i < capacity; ++i) {
    // As if lap -1 had been published and read: free for record i.
    new (base + l.published + i * l.published_stride) std::atomic<uint64_t>(i + 1 - capacity);
    new (base + l.freed + i * 8) std::atomic<uint64_t>(i);
  }
  return {};
}

Result<SpscCore> SpscCore::attach(void* region, size_t region_bytes, size_t record_bytes,
                                  LockSpace locks) {
  if (region_bytes < sizeof(SpscRingHeader))
    return make_error(Errc::kCorrupt, "spsc ring region smaller than its header");
  auto* h = static_cast<SpscRingHeader*>(region);
  // Read the geometry once; the copy is what this process trusts.
  const uint32_t got_record = h->record_bytes;
  const uint32_t got_slot = h->slot_bytes;
  const uint32_t got_capacity = h->capacity;
  if (got_record != record_bytes)
    return make_error(Errc::kLayoutMismatch,
                      fmt::format("spsc ring holds {}-byte records, this reader expects {}",
                                  got_record, record_bytes));
  if (got_slot != spsc_region_layout(got_capacity, got_record).slot_bytes)
    return make_error(Errc::kCorrupt, fmt::format("spsc ring slot size {} impossible for {}-byte "
                                                  "records",
                                                  got_slot, got_record));
  if (!is_pow2(got_capacity) || got_capacity < 2)
    return make_error(Errc::kCorrupt,
                      fmt::format("spsc ring capacity {} is not a power of two", got_capacity));
  const size_t need = spsc_region_bytes(got_capacity, got_record);
  if (need > region_bytes)
    return make_error(Errc::kCorrupt,
                      fmt::format("spsc ring of {} x {} bytes needs {} bytes, region has {}",
                                  got_capacity, record_bytes, need, region_bytes));
  const SpscRegionLayout l = spsc_region_layout(got_capacity, got_record);
  auto* base = static_cast<std::byte*>(region);
  SpscCore c;
  c.h = h;
  c.published_words = base + l.published;
  c.records = base + l.records;
  c.freed_words = reinterpret_cast<std::atomic<uint64_t>*>(base + l.freed);
  c.capacity = got_capacity;
  c.mask = got_capacity - 1;
  c.slot_bytes = l.slot_bytes;
  c.published_stride = l.published_stride;
  c.published_per_line = 64 / l.published_stride;
  c.locks = locks;
  return c;
}

namespace {

// Where the consumer is, from the slots alone: the lowest index a slot is
// free for, whether its record is published yet or not (the consumer reads
// in order, so every index below it has been read). Used when a side is
// taken over, instead of the mirrors. A `freed` word that names another
// slot's index has been written over, and is ignored.
uint64_t recover_read_index(const SpscCore& c) {
  uint64_t lowest = UINT64_MAX;
  for (uint64_t k = 0; k < c.capacity; ++k) {
    const uint64_t f = c.freed(k).load(std::memory_order_acquire);
    if ((f & c.mask) == k) lowest = std::min(lowest, f);
  }
  return lowest == UINT64_MAX ? c.h->read_index.load(std::memory_order_acquire) : lowest;
}

}  // namespace

Result<uint64_t> SpscCore::lease_producer() const {
  if (!locks.try_lock(kLeaseOffset))
    return make_error(Errc::kBusy,
                      fmt::format("another process (pid {}) is this ring's producer; one process "
                                  "produces into a ring at a time",
                                  h->producer_pid.load(std::memory_order_relaxed)));
  h->producer_pid.store(self_pid(), std::memory_order_relaxed);
  h->producer_generation.fetch_add(1, std::memory_order_relaxed);
  // Take over: continue after the last record published since the consumer's
  // position, and mark what a dead predecessor claimed but never published,
  // so that the consumer does not wait for it.
  const uint64_t r = recover_read_index(*this);
  uint64_t end = r;
  for (uint64_t i = r; i < r + capacity; ++i) {
    const uint64_t p = published(i).load(std::memory_order_acquire);
    if (written(i, p)) end = i + 1;
  }
  for (uint64_t i = r; i < end; ++i) {
    uint64_t p = published(i).load(std::memory_order_acquire);
    if (unpublished(i, p) &&
        published(i).compare_exchange_strong(p, (i + 1) | kFiller, std::memory_order_release))
      h->skipped_records.fetch_add(1, std::memory_order_relaxed);
  }
  h->write_index.store(end, std::memory_order_release);
  notify_waiters(h->not_empty);
  return end;
}

void SpscCore::release_producer() const {
  locks.unlock(kLeaseOffset);
}

uint64_t SpscCore::consumer_index() {
  if (!read_known) {
    next_read = recover_read_index(*this);
    read_known = true;
    h->read_index.store(next_read, std::memory_order_relaxed);
    return next_read;
  }
  if (h->read_index.load(std::memory_order_relaxed) != next_read) {
    h->corrupt_events.fetch_add(1, std::memory_order_relaxed);
    h->read_index.store(next_read, std::memory_order_relaxed);
  }
  return next_read;
}

bool SpscCore::step_over_dead_hole(uint64_t r, uint64_t p) {
  // A hole, not the end: some later index was published.
  bool later = false;
  const uint64_t look = std::min<uint64_t>(capacity, 256);
  for (uint64_t i = r + 1; i < r + look && !later; ++i) {
    const uint64_t q = published(i).load(std::memory_order_acquire);
    later = written(i, q);
  }
  if (!later) {
    hole_at = UINT64_MAX;
    return false;
  }
  const uint64_t now = mono_now_ns();
  if (hole_at != r) {
    hole_at = r;
    hole_since_ns = now;
    return false;
  }
  if (now - hole_since_ns < kHoleCheckNs) return false;
  if (locks.probe(kLeaseOffset) != LockState::kFree)
    return false;  // its producer may still publish
  // A filler, which the caller then reads as one. A new producer's takeover
  // may mark it at the same moment: one CAS wins, and counts it.
  if (!published(r).compare_exchange_strong(p, (r + 1) | kFiller, std::memory_order_acq_rel))
    return false;
  h->skipped_records.fetch_add(1, std::memory_order_relaxed);
  hole_at = UINT64_MAX;
  return true;
}

}  // namespace kvrelay
