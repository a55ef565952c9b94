#include "shm/mpsc_ring.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "shm/bits.h"
#include "shm/chaos.h"
#include "shm/process_identity.h"

namespace kvrelay {

namespace {

// The in-progress marker a producer leaves in `type` until it commits.
int32_t self_pid_marker() {
  return static_cast<int32_t>(self_pid());
}

}  // namespace

Status MpscRing::initialize(void* region, size_t region_bytes, uint64_t capacity,
                            uint32_t max_payload_bytes) {
  if (!is_pow2(capacity) || capacity < 64 || capacity > kMaxCapacity)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("mpsc ring capacity {} must be a power of two in [64, {}]",
                                  capacity, kMaxCapacity));
  if (max_payload_bytes == 0 || max_payload_bytes > default_max_payload(capacity))
    return make_error(Errc::kInvalidArgument,
                      fmt::format("mpsc ring max payload {} must be in [1, {}] for capacity {}",
                                  max_payload_bytes, default_max_payload(capacity), capacity));
  if (region_bytes < bytes_for(capacity))
    return make_error(Errc::kInvalidArgument, "mpsc ring region too small for its capacity");
  auto* h = new (region) MpscRingHeader{};
  h->capacity = capacity;
  h->max_payload_bytes = max_payload_bytes;
  return {};
}

Result<MpscRing> MpscRing::attach(void* region, size_t region_bytes) {
  if (region_bytes < sizeof(MpscRingHeader))
    return make_error(Errc::kCorrupt, "mpsc ring region smaller than its header");
  auto* h = static_cast<MpscRingHeader*>(region);
  if (!is_pow2(h->capacity) || h->capacity < 64 || h->capacity > kMaxCapacity)
    return make_error(Errc::kCorrupt,
                      fmt::format("mpsc ring capacity {} is not a power of two in [64, {}]",
                                  h->capacity, kMaxCapacity));
  if (bytes_for(h->capacity) > region_bytes)
    return make_error(Errc::kCorrupt,
                      fmt::format("mpsc ring capacity {} does not fit its {}-byte region",
                                  h->capacity, region_bytes));
  if (h->max_payload_bytes == 0 || h->max_payload_bytes > default_max_payload(h->capacity))
    return make_error(Errc::kCorrupt,
                      fmt::format("mpsc ring max payload {} impossible for capacity {}",
                                  h->max_payload_bytes, h->capacity));
  return MpscRing(h);
}

MpscRing::MpscRing(MpscRingHeader* h)
    : h_(h),
      buffer_(reinterpret_cast<std::byte*>(h) + sizeof(MpscRingHeader)),
      capacity_(h->capacity),
      mask_(h->capacity - 1) {}

uint64_t MpscRing::used_bytes() const {
  const uint64_t head = h_->head.load(std::memory_order_acquire);
  const uint64_t tail = h_->tail.load(std::memory_order_acquire);
  return tail >= head ? tail - head : 0;
}

// Whether `required` bytes can be claimed at `tail` with the consumer at
// `head`. The difference tail - head is taken only when head <= tail: a head
// read after the tail may already be past it (the caller then re-reads the
// tail), and an unsigned difference would wrap and report a full ring as
// empty.
bool MpscRing::fits(uint64_t tail, uint64_t head, uint64_t required) const {
  if (head > tail) return true;  // stale tail: let try_claim look again
  if (tail - head > capacity_ - required) return false;
  const uint64_t to_end = capacity_ - (tail & mask_);
  return required <= to_end || required <= (head & mask_);  // before the end, or after a wrap
}

// Positions written by well-behaved processes are 8-byte aligned and at most
// a ring apart. Anything else was scribbled by a process that bypassed this
// class: touching records at such positions would be misaligned, so nothing
// is read or written until the state makes sense again.
bool MpscRing::sane(uint64_t head, uint64_t tail) const {
  return head % kAlignment == 0 && tail % kAlignment == 0 && head <= tail &&
         tail - head <= capacity_;
}

Result<MpscClaim> MpscRing::try_claim(size_t payload_bytes) {
  if (payload_bytes > h_->max_payload_bytes)
    return make_error(Errc::kTooLarge,
                      fmt::format("record of {} bytes exceeds this ring's limit of {} bytes",
                                  payload_bytes, h_->max_payload_bytes));
  const uint64_t record_length = kRecordHeaderBytes + payload_bytes;
  const uint64_t required = align_up(record_length, kAlignment);

  uint64_t tail = 0;
  uint64_t padding = 0;
  for (;;) {
    // head_cache first, then tail: the cache is then never ahead of the
    // tail, so tail - head cannot wrap. A cache that is a lap or more behind
    // makes the ring look full, and is refreshed below.
    uint64_t head = h_->head_cache.load(std::memory_order_acquire);
    KVRELAY_CHAOS_POINT();
    tail = h_->tail.load(std::memory_order_acquire);
    if (tail % kAlignment != 0)
      return make_error(Errc::kCorrupt, "ring state is corrupt (misaligned tail); nothing written");
    if (tail - head > capacity_ - required) {
      head = h_->head.load(std::memory_order_acquire);
      if (head > tail) {
        // The tail moved on meanwhile: start again. A head past even a fresh
        // tail only happens in a scribbled ring: refuse rather than spin.
        if (head > h_->tail.load(std::memory_order_acquire))
          return make_error(Errc::kCorrupt,
                            "ring state is corrupt (head past tail); nothing written");
        continue;
      }
      if (tail - head > capacity_ - required) {
        h_->full_events.fetch_add(1, std::memory_order_relaxed);
        return make_error(Errc::kFull, "ring full");
      }
      h_->head_cache.store(head, std::memory_order_release);
    }
    padding = 0;
    const uint64_t tail_index = tail & mask_;
    const uint64_t to_end = capacity_ - tail_index;
    if (required > to_end) {
      // Does not fit before the end: pad to the end and start again at 0,
      // which needs `required` free bytes before the consumer's position.
      uint64_t head_index = head & mask_;
      if (required > head_index) {
        head = h_->head.load(std::memory_order_acquire);
        if (head > tail) {
          if (head > h_->tail.load(std::memory_order_acquire))
            return make_error(Errc::kCorrupt,
                              "ring state is corrupt (head past tail); nothing written");
          continue;
        }
        head_index = head & mask_;
        if (required > head_index) {
          h_->full_events.fetch_add(1, std::memory_order_relaxed);
          return make_error(Errc::kFull, "ring full");
        }
        h_->head_cache.store(head, std::memory_order_release);
      }
      padding = to_end;
    }
    if (h_->tail.compare_exchange_weak(tail, tail + required + padding, std::memory_order_acq_rel,
                                       std::memory_order_relaxed)) {
      break;
    }
  }

  KVRELAY_CHAOS_POINT();
  uint64_t offset = tail & mask_;
  if (padding != 0) {
    MpscRecordHeader& pad = record_at(offset);
    pad.type.store(kPaddingType, std::memory_order_relaxed);
    pad.length.store(static_cast<int32_t>(padding), std::memory_order_release);
    offset = 0;
    KVRELAY_CHAOS_POINT();
  }
  MpscRecordHeader& rec = record_at(offset);
  rec.type.store(self_pid_marker(), std::memory_order_relaxed);
  rec.length.store(-static_cast<int32_t>(record_length), std::memory_order_release);
  return MpscClaim{offset, static_cast<int32_t>(record_length),
                   std::span<std::byte>(buffer_ + offset + kRecordHeaderBytes, payload_bytes)};
}

Result<MpscClaim> MpscRing::claim(size_t payload_bytes, Deadline deadline) {
  for (;;) {
    Result<MpscClaim> c = try_claim(payload_bytes);
    if (c.ok() || c.code() != Errc::kFull || deadline.passed()) return c;
    const uint64_t required = align_up(kRecordHeaderBytes + payload_bytes, kAlignment);
    // Wake when the record would fit, wrap padding included (a weaker test
    // would spin: free bytes split across the end do not make room).
    const bool room = wait_until(
        h_->not_full,
        [&] {
          return fits(h_->tail.load(std::memory_order_acquire),
                      h_->head.load(std::memory_order_acquire), required);
        },
        deadline);
    if (!room) {
      return make_error(Errc::kTimeout,
                        fmt::format("ring stayed full until the deadline ({} bytes needed, {} of "
                                    "{} in use)",
                                    required, used_bytes(), capacity_));
    }
  }
}

void MpscRing::commit(const MpscClaim& claim, int32_t type) {
  KVRELAY_CHAOS_POINT();
  MpscRecordHeader& rec = record_at(claim.offset);
  rec.type.store(type, std::memory_order_relaxed);
  rec.length.store(claim.record_length, std::memory_order_release);  // publish
  notify_waiters(h_->not_empty);
}

void MpscRing::abort(const MpscClaim& claim) {
  commit(claim, kPaddingType);
}

Status MpscRing::try_write(int32_t type, std::span<const std::byte> payload) {
  Result<MpscClaim> c = try_claim(payload.size());
  if (!c) return c.error();
  if (!payload.empty()) std::memcpy(c->payload.data(), payload.data(), payload.size());
  commit(*c, type);
  return {};
}

Status MpscRing::write(int32_t type, std::span<const std::byte> payload, Deadline deadline) {
  Result<MpscClaim> c = claim(payload.size(), deadline);
  if (!c) return c.error();
  if (!payload.empty()) std::memcpy(c->payload.data(), payload.data(), payload.size());
  commit(*c, type);
  return {};
}

// Reads records from head up to the end of the buffer (a record never
// straddles the end). Returns records handed to the handler; `progressed`
// says whether head moved (padding alone moves it too).
size_t MpscRing::read_contiguous(const Handler& handler, size_t max_records, bool& progressed) {
  const uint64_t head = h_->head.load(std::memory_order_relaxed);
  const uint64_t head_index = head & mask_;
  const uint64_t contiguous = capacity_ - head_index;
  uint64_t bytes_read = 0;
  size_t records = 0;

  while (bytes_read < contiguous && records < max_records) {
    const uint64_t offset = head_index + bytes_read;
    MpscRecordHeader& rec = record_at(offset);
    const int32_t length = rec.length.load(std::memory_order_acquire);
    if (length <= 0) break;
    KVRELAY_CHAOS_POINT();
    const uint64_t aligned = align_up(static_cast<uint64_t>(length), kAlignment);
    const int32_t type = rec.type.load(std::memory_order_relaxed);
    if (static_cast<uint64_t>(length) < kRecordHeaderBytes || aligned > contiguous - bytes_read ||
        (type != kPaddingType &&
         static_cast<uint64_t>(length) > kRecordHeaderBytes + h_->max_payload_bytes)) {
      // Only a writer bypassing this class can produce this. Record
      // boundaries past here are unknowable: drop the rest of this
      // contiguous stretch, count it, and stay memory-safe.
      h_->corrupt_records.fetch_add(1, std::memory_order_relaxed);
      const uint64_t tail = h_->tail.load(std::memory_order_acquire);
      bytes_read = std::min(contiguous, tail - head);
      break;
    }
    bytes_read += aligned;
    if (type == kPaddingType) continue;
    handler(type, std::span<const std::byte>(buffer_ + offset + kRecordHeaderBytes,
                                             static_cast<size_t>(length) - kRecordHeaderBytes));
    ++records;
  }

  progressed = bytes_read != 0;
  if (progressed) {
    // Zero before releasing, so that a producer's claim always starts from
    // zeroed headers (length 0 means "nothing written yet").
    KVRELAY_CHAOS_POINT();
    std::memset(buffer_ + head_index, 0, bytes_read);
    KVRELAY_CHAOS_POINT();
    h_->records_read.fetch_add(records, std::memory_order_relaxed);
    h_->head.store(head + bytes_read, std::memory_order_release);
    notify_waiters(h_->not_full);
  }
  return records;
}

size_t MpscRing::read(const Handler& handler, size_t max_records) {
  if (!sane(h_->head.load(std::memory_order_relaxed), h_->tail.load(std::memory_order_acquire))) {
    h_->corrupt_records.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  size_t total = 0;
  bool progressed = true;
  // Two passes at most: up to the end of the buffer, then from its start.
  for (int pass = 0; pass < 2 && progressed && total < max_records; ++pass) {
    total += read_contiguous(handler, max_records - total, progressed);
  }
  if (total == 0 && !progressed) note_stall();
  return total;
}

bool MpscRing::has_committed_record() const {
  const uint64_t head = h_->head.load(std::memory_order_relaxed);
  if (head % kAlignment != 0) return false;
  return record_at(head & mask_).length.load(std::memory_order_acquire) > 0;
}

size_t MpscRing::read_wait(const Handler& handler, size_t max_records, Deadline deadline) {
  for (;;) {
    if (size_t n = read(handler, max_records); n > 0) return n;
    if (deadline.passed()) return 0;
    // While something is claimed but not committed, wake up now and then to
    // let read() judge whether its producer died.
    Deadline until = deadline;
    if (used_bytes() != 0) {
      const Deadline poll = Deadline::after(stall_timeout_ / 4);
      if (poll.ns() < until.ns()) until = poll;
    }
    wait_until(
        h_->not_empty, [&] { return has_committed_record(); }, until);
  }
}

std::vector<MpscRing::PeekedRecord> MpscRing::peek(size_t max_records) const {
  std::vector<PeekedRecord> out;
  const uint64_t head = h_->head.load(std::memory_order_acquire);
  const uint64_t tail = h_->tail.load(std::memory_order_acquire);
  if (!sane(head, tail)) return out;
  // Walk by distance from head: positions may sit anywhere in 64 bits.
  for (uint64_t pos = head; out.size() < max_records && pos - head < tail - head;) {
    const uint64_t index = pos & mask_;
    const MpscRecordHeader& rec = record_at(index);
    const int32_t length = rec.length.load(std::memory_order_acquire);
    if (length <= 0) break;  // not committed yet
    const uint64_t aligned = align_up(static_cast<uint64_t>(length), kAlignment);
    if (static_cast<uint64_t>(length) < kRecordHeaderBytes || aligned > capacity_ - index) break;
    const int32_t type = rec.type.load(std::memory_order_relaxed);
    if (type != kPaddingType) {
      PeekedRecord r{pos, type, {}};
      r.payload.resize(static_cast<size_t>(length) - kRecordHeaderBytes);
      if (!r.payload.empty())
        std::memcpy(r.payload.data(), buffer_ + index + kRecordHeaderBytes, r.payload.size());
      // If the consumer passed this record while we copied, it may be zeroed
      // or reused: the copy cannot be trusted.
      std::atomic_thread_fence(std::memory_order_acquire);
      if (h_->head.load(std::memory_order_relaxed) > pos) break;
      out.push_back(std::move(r));
    }
    pos += aligned;
  }
  return out;
}

bool MpscRing::wait_readable(Deadline deadline) {
  return wait_until(
      h_->not_empty, [&] { return has_committed_record(); }, deadline);
}

void MpscRing::note_stall() {
  const uint64_t head = h_->head.load(std::memory_order_relaxed);
  if (h_->tail.load(std::memory_order_acquire) == head) {
    stall_head_ = UINT64_MAX;  // empty, not stalled
    return;
  }
  const uint64_t now = mono_now_ns();
  if (stall_head_ != head) {
    stall_head_ = head;
    stall_since_ns_ = now;
    return;
  }
  const uint64_t waited = now - stall_since_ns_;
  const auto timeout = static_cast<uint64_t>(stall_timeout_.count());
  if (waited < timeout) return;
  // A negative length carries the producer's pid in `type`; while that
  // process still runs, give it four times as long before taking its record.
  const MpscRecordHeader& rec = record_at(head & mask_);
  if (rec.length.load(std::memory_order_acquire) < 0) {
    const int32_t pid = rec.type.load(std::memory_order_relaxed);
    if (pid > 0 && pid_exists(static_cast<uint32_t>(pid)) && waited < 4 * timeout) return;
  }
  if (unblock()) {
    h_->skipped_records.fetch_add(1, std::memory_order_relaxed);
    stall_head_ = UINT64_MAX;
  }
}

// Turns the blocked record at head into padding (Aeron's unblock).
bool MpscRing::unblock() {
  const uint64_t head = h_->head.load(std::memory_order_relaxed);
  const uint64_t tail = h_->tail.load(std::memory_order_acquire);
  const uint64_t consumer_index = head & mask_;
  const uint64_t producer_index = tail & mask_;
  if (tail == head) return false;
  MpscRecordHeader& rec = record_at(consumer_index);

  int32_t length = rec.length.load(std::memory_order_acquire);
  if (length < 0) {
    // Header written, payload never committed: its length is known (kept
    // within what is left before the end, in case it was scribbled).
    const uint64_t room = capacity_ - consumer_index;
    const uint64_t claimed =
        align_up(static_cast<uint64_t>(-static_cast<int64_t>(length)), kAlignment);
    const auto padding =
        static_cast<int32_t>(std::clamp<uint64_t>(claimed, kRecordHeaderBytes, room));
    rec.type.store(kPaddingType, std::memory_order_relaxed);
    return rec.length.compare_exchange_strong(length, padding, std::memory_order_release);
  }
  if (length > 0) return false;  // it was committed meanwhile

  // Claimed, but not even the header was written: the record ends where the
  // next non-zero header starts. Everything in between must still be zero.
  const uint64_t limit = producer_index > consumer_index ? producer_index : capacity_;
  for (uint64_t i = consumer_index + kAlignment; i < limit; i += kAlignment) {
    if (record_at(i).length.load(std::memory_order_acquire) != 0) {
      for (uint64_t j = consumer_index; j < i; j += 8) {
        uint64_t word = 0;
        std::memcpy(&word, buffer_ + j, sizeof(word));
        if (word != 0) return false;
      }
      rec.type.store(kPaddingType, std::memory_order_relaxed);
      int32_t expected = 0;
      return rec.length.compare_exchange_strong(expected, static_cast<int32_t>(i - consumer_index),
                                                std::memory_order_release);
    }
  }
  // Nothing follows before the end of the buffer. If the tail has wrapped,
  // the dead claim runs to the end (its producer died before writing the
  // wrap padding, or the record itself ends there): pad to the end.
  if (producer_index <= consumer_index) {
    rec.type.store(kPaddingType, std::memory_order_relaxed);
    int32_t expected = 0;
    return rec.length.compare_exchange_strong(
        expected, static_cast<int32_t>(capacity_ - consumer_index), std::memory_order_release);
  }
  return false;  // the dead claim is the newest record; a later one will delimit it
}

}  // namespace kvrelay
