#include "shm/mpsc_ring.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <set>
#include <thread>

#include "shm/bits.h"
#include "shm/chaos.h"
#include "shm/fault_point.h"
#include "shm/process_identity.h"

namespace kvrelay {

namespace hdr = mpsc_header;

namespace {

// How long a claim with no producer at all (no in-progress header, no intent
// covering it: something wrote behind the ring's back) may block the consumer,
// in stall timeouts, before it is given up.
constexpr uint64_t kOrphanStallFactor = 8;
// The corruption text kept for take_corruption() between two calls.
constexpr size_t kMaxCorruptionText = 2048;

// The producer slots this process leased. A second lease through the same
// open file description would be granted its own lock again, so the process
// remembers what it holds.
std::mutex g_leased_mu;
std::set<const void*> g_leased;

bool note_leased(const void* slot) {
  std::lock_guard lock(g_leased_mu);
  return g_leased.insert(slot).second;
}
bool leased_here(const void* slot) {
  std::lock_guard lock(g_leased_mu);
  return g_leased.count(slot) != 0;
}
void forget_leased(const void* slot) {
  std::lock_guard lock(g_leased_mu);
  g_leased.erase(slot);
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

Result<MpscRing> MpscRing::attach(void* region, size_t region_bytes, LockSpace locks) {
  if (region_bytes < sizeof(MpscRingHeader))
    return make_error(Errc::kCorrupt, "mpsc ring region smaller than its header");
  auto* h = static_cast<MpscRingHeader*>(region);
  // Read the geometry once: the copy is what this process trusts from now on.
  const uint64_t capacity = h->capacity;
  const uint32_t max_payload = h->max_payload_bytes;
  if (!is_pow2(capacity) || capacity < 64 || capacity > kMaxCapacity)
    return make_error(Errc::kCorrupt,
                      fmt::format("mpsc ring capacity {} is not a power of two in [64, {}]",
                                  capacity, kMaxCapacity));
  if (bytes_for(capacity) > region_bytes)
    return make_error(Errc::kCorrupt,
                      fmt::format("mpsc ring capacity {} does not fit its {}-byte region", capacity,
                                  region_bytes));
  if (max_payload == 0 || max_payload > default_max_payload(capacity))
    return make_error(Errc::kCorrupt, fmt::format("mpsc ring max payload {} impossible for "
                                                  "capacity {}",
                                                  max_payload, capacity));
  MpscRing ring(h, locks);
  ring.capacity_ = capacity;
  ring.mask_ = capacity - 1;
  ring.max_payload_ = max_payload;
  return ring;
}

MpscRing::MpscRing(MpscRingHeader* h, LockSpace locks)
    : h_(h), buffer_(reinterpret_cast<std::byte*>(h) + sizeof(MpscRingHeader)), locks_(locks) {}

uint64_t MpscRing::used_bytes() const {
  const uint64_t head = h_->head.load(std::memory_order_acquire);
  const uint64_t tail = h_->tail.load(std::memory_order_acquire);
  return tail >= head ? std::min(tail - head, capacity_) : 0;
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
// class: nothing is read or written at such positions until the state makes
// sense again.
bool MpscRing::sane(uint64_t head, uint64_t tail) const {
  return head % kAlignment == 0 && tail % kAlignment == 0 && head <= tail &&
         tail - head <= capacity_;
}

bool MpscRing::indices_sane() const {
  return sane(h_->head.load(std::memory_order_acquire), h_->tail.load(std::memory_order_acquire));
}

// ---------------------------------------------------------------------------
// The consumer's lease

Result<MpscConsumerLease> MpscRing::lease_consumer(uint32_t tag) const {
  std::atomic<uint32_t>* key = &h_->consumer_pid;
  auto busy = [&] {
    std::optional<MpscConsumerHolder> holder = consumer_holder();
    // The winner writes its pid a few instructions after taking the lock: a
    // loser that lands in between waits for it briefly, so that its error
    // names the reader rather than "pid 0".
    const Deadline named = Deadline::after(std::chrono::milliseconds(200));
    while (holder && holder->pid == 0 && !named.passed()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      holder = consumer_holder();
    }
    if (holder && holder->pid == 0)
      return make_error(Errc::kBusy, "another process is taking the reader's lease just now");
    if (!holder || holder->pid == self_pid())
      return make_error(Errc::kBusy, "another reader in this process holds it");
    return make_error(Errc::kBusy, fmt::format("another process reads it: pid {}, session {:08x}",
                                               holder->pid, holder->tag));
  };
  // This process's lease through this very mapping (its lock would be
  // granted again through the same open file description).
  if (leased_here(key)) return busy();
  if (!locks_.try_lock(kConsumerLockOffset)) return busy();
  if (!note_leased(key)) {
    locks_.unlock(kConsumerLockOffset);
    return busy();
  }
  KVRELAY_FAULT_POINT("mpsc.consumer_locked");
  h_->consumer_tag.store(tag, std::memory_order_relaxed);
  h_->consumer_pid.store(self_pid(), std::memory_order_release);  // the tag before the pid
  h_->consumer_generation.fetch_add(1, std::memory_order_acq_rel);
  return MpscConsumerLease(locks_, h_);
}

std::optional<MpscConsumerHolder> MpscRing::consumer_holder() const {
  if (locks_.probe(kConsumerLockOffset) != LockState::kHeld) return std::nullopt;
  const uint32_t pid = h_->consumer_pid.load(std::memory_order_acquire);
  return MpscConsumerHolder{pid, h_->consumer_tag.load(std::memory_order_relaxed)};
}

void MpscConsumerLease::release() {
  if (header_ == nullptr) return;
  header_->consumer_pid.store(0, std::memory_order_relaxed);
  header_->consumer_tag.store(0, std::memory_order_relaxed);
  locks_.unlock(MpscRing::kConsumerLockOffset);
  forget_leased(&header_->consumer_pid);
  header_ = nullptr;
}

// ---------------------------------------------------------------------------
// Producers

Result<MpscProducer> MpscRing::lease_producer() const {
  const uint64_t head = h_->head.load(std::memory_order_acquire);
  // A slot whose dead leaser left a claim the consumer has not passed yet is
  // left alone: its intent is the only record of where that claim ends.
  auto claim_pending = [&](const MpscProducerSlot& s) {
    const uint64_t bytes = s.intent_bytes.load(std::memory_order_acquire);
    return bytes != 0 && s.intent_position.load(std::memory_order_relaxed) + bytes > head;
  };
  for (uint32_t i = 0; i < kMpscProducerSlots; ++i) {
    MpscProducerSlot& s = h_->producers[i];
    if (leased_here(&s) || claim_pending(s)) continue;
    if (locks_.fd < 0) {
      // No lock file (anonymous memory): the state word is the lease.
      uint32_t st = s.state.load(std::memory_order_acquire);
      if (st == static_cast<uint32_t>(MpscSlotState::kLeased) ||
          !s.state.compare_exchange_strong(st, static_cast<uint32_t>(MpscSlotState::kLeased),
                                           std::memory_order_acq_rel))
        continue;
    } else {
      if (!locks_.try_lock(producer_lock_offset(i))) continue;
      if (claim_pending(s)) {  // its leaser died mid-claim just now
        locks_.unlock(producer_lock_offset(i));
        continue;
      }
      s.state.store(static_cast<uint32_t>(MpscSlotState::kLeased), std::memory_order_release);
    }
    if (!note_leased(&s)) {
      if (locks_.fd >= 0) locks_.unlock(producer_lock_offset(i));
      continue;
    }
    s.intent_bytes.store(0, std::memory_order_relaxed);
    s.pid.store(self_pid(), std::memory_order_relaxed);
    const uint32_t generation = s.generation.fetch_add(1, std::memory_order_acq_rel) + 1;
    return MpscProducer(*this, i, generation);
  }
  return make_error(Errc::kBusy,
                    fmt::format("all {} producer slots of this ring are held by live processes "
                                "(or by claims of dead ones not yet passed)",
                                kMpscProducerSlots));
}

MpscProducer::MpscProducer(MpscRing ring, uint32_t slot, uint32_t generation)
    : ring_(std::move(ring)),
      slot_(slot),
      generation_(generation),
      leased_(true),
      mu_(std::make_unique<std::mutex>()) {}

MpscProducer::MpscProducer(MpscProducer&& o) noexcept
    : ring_(std::move(o.ring_)),
      slot_(o.slot_),
      generation_(o.generation_),
      leased_(std::exchange(o.leased_, false)),
      sole_(o.sole_),
      tail_(o.tail_),
      corruption_(std::move(o.corruption_)),
      mu_(std::move(o.mu_)) {}

MpscProducer& MpscProducer::operator=(MpscProducer&& o) noexcept {
  if (this != &o) {
    release();
    ring_ = std::move(o.ring_);
    slot_ = o.slot_;
    generation_ = o.generation_;
    leased_ = std::exchange(o.leased_, false);
    sole_ = o.sole_;
    tail_ = o.tail_;
    corruption_ = std::move(o.corruption_);
    mu_ = std::move(o.mu_);
  }
  return *this;
}

MpscProducer::~MpscProducer() {
  release();
}

void MpscProducer::release() {
  if (!leased_) return;
  leased_ = false;
  MpscProducerSlot& s = slot_ref();
  s.intent_bytes.store(0, std::memory_order_release);
  s.released_generation.store(generation_, std::memory_order_release);
  s.state.store(static_cast<uint32_t>(MpscSlotState::kReleased), std::memory_order_release);
  ring_.locks_.unlock(MpscRing::producer_lock_offset(slot_));
  forget_leased(&s);
}

Result<MpscClaim> MpscProducer::try_claim(size_t payload_bytes) {
  MpscRingHeader* h = ring_.h_;
  const uint64_t capacity = ring_.capacity_;
  const uint64_t mask = ring_.mask_;
  if (payload_bytes > ring_.max_payload_)
    return make_error(Errc::kTooLarge,
                      fmt::format("record of {} bytes exceeds this ring's limit of {} bytes",
                                  payload_bytes, ring_.max_payload_));
  const uint64_t record_length = MpscRing::kRecordHeaderBytes + payload_bytes;
  const uint64_t required = align_up(record_length, MpscRing::kAlignment);
  MpscProducerSlot& slot = slot_ref();
  auto give_up = [&](Errc code, std::string message) -> Result<MpscClaim> {
    slot.intent_bytes.store(0, std::memory_order_release);
    if (code == Errc::kFull) h->full_events.fetch_add(1, std::memory_order_relaxed);
    return make_error(code, std::move(message));
  };

  if (sole_ && tail_ != UINT64_MAX) {
    uint64_t seen = h->tail.load(std::memory_order_acquire);
    if (seen != tail_ && h->tail.compare_exchange_strong(seen, tail_, std::memory_order_acq_rel)) {
      h->corrupt_events.fetch_add(1, std::memory_order_relaxed);
      if (corruption_.size() < 1024)
        corruption_ += fmt::format("{}tail was overwritten with {} (it was {}); restored",
                                   corruption_.empty() ? "" : "; ", seen, tail_);
    }
  }
  uint64_t tail = 0;
  uint64_t padding = 0;
  for (;;) {
    // head_cache first, then tail: the cache is then never ahead of the
    // tail, so tail - head cannot wrap. A cache that is a lap or more behind
    // makes the ring look full, and is refreshed below.
    uint64_t head = h->head_cache.load(std::memory_order_acquire);
    KVRELAY_CHAOS_POINT();
    tail = h->tail.load(std::memory_order_acquire);
    if (tail % MpscRing::kAlignment != 0)
      return give_up(Errc::kCorrupt, "ring state is corrupt (misaligned tail); nothing written");
    if (head > tail || tail - head > capacity - required) {
      head = h->head.load(std::memory_order_acquire);
      if (head > tail) {
        // The tail moved on meanwhile: start again. A head past even a fresh
        // tail only happens in a scribbled ring: refuse rather than spin.
        if (head > h->tail.load(std::memory_order_acquire))
          return give_up(Errc::kCorrupt, "ring state is corrupt (head past tail); nothing written");
        continue;
      }
      if (tail - head > capacity)
        return give_up(Errc::kCorrupt,
                       "ring state is corrupt (tail more than a ring ahead of head); nothing "
                       "written");
      if (tail - head > capacity - required) return give_up(Errc::kFull, "ring full");
      h->head_cache.store(head, std::memory_order_release);
    }
    padding = 0;
    const uint64_t tail_index = tail & mask;
    const uint64_t to_end = capacity - tail_index;
    if (required > to_end) {
      // Does not fit before the end: pad to the end and start again at 0,
      // which needs `required` free bytes before the consumer's position.
      uint64_t head_index = head & mask;
      if (required > head_index) {
        head = h->head.load(std::memory_order_acquire);
        if (head > tail) {
          if (head > h->tail.load(std::memory_order_acquire))
            return give_up(Errc::kCorrupt,
                           "ring state is corrupt (head past tail); nothing written");
          continue;
        }
        head_index = head & mask;
        if (required > head_index) return give_up(Errc::kFull, "ring full");
        h->head_cache.store(head, std::memory_order_release);
      }
      padding = to_end;
    }
    // Free space is zero: the consumer zeroes what it read. A header that a
    // stray write left there would be taken for this claim's record in the
    // moment between the tail CAS and our in-progress header: clear it first.
    if (!clear_stray_header(tail & mask, tail) || (padding != 0 && !clear_stray_header(0, tail)))
      continue;
    // The intent, before the claim: the consumer finds the owner of a claim
    // whose header is not written yet through it (see the top).
    slot.intent_position.store(tail, std::memory_order_relaxed);
    slot.intent_bytes.store(required + padding, std::memory_order_release);
    if (h->tail.compare_exchange_weak(tail, tail + required + padding, std::memory_order_acq_rel,
                                      std::memory_order_relaxed)) {
      tail_ = tail + required + padding;
      break;
    }
  }

  KVRELAY_CHAOS_POINT();
  KVRELAY_FAULT_POINT("mpsc.claimed");
  const auto session = static_cast<uint16_t>(generation_);
  const auto me = static_cast<uint8_t>(slot_);
  uint64_t offset = tail & mask;
  if (padding != 0) {
    ring_.header_at(offset).store(
        hdr::pack(static_cast<int32_t>(padding), hdr::kPaddingType, me, session),
        std::memory_order_release);
    offset = 0;
    KVRELAY_CHAOS_POINT();
  }
  const uint64_t in_progress = hdr::pack(-static_cast<int32_t>(record_length), 0, me, session);
  ring_.header_at(offset).store(in_progress, std::memory_order_release);
  return MpscClaim{
      offset, in_progress, static_cast<int32_t>(record_length),
      std::span<std::byte>(ring_.buffer_ + offset + MpscRing::kRecordHeaderBytes, payload_bytes)};
}

// A non-zero header at `offset`, in free space while the tail still is
// `tail`, was left by a stray write: CAS it back to zero (a claim that wins
// the tail meanwhile writes a different word, and keeps it). Returns false
// when the tail moved, so the caller starts again.
bool MpscProducer::clear_stray_header(uint64_t offset, uint64_t tail) {
  std::atomic<uint64_t>& word = ring_.header_at(offset);
  uint64_t seen = word.load(std::memory_order_acquire);
  if (seen == 0) return true;
  if (ring_.h_->tail.load(std::memory_order_acquire) != tail) return false;
  if (word.compare_exchange_strong(seen, 0, std::memory_order_acq_rel))
    ring_.h_->corrupt_events.fetch_add(1, std::memory_order_relaxed);
  return true;
}

Result<MpscClaim> MpscProducer::claim(size_t payload_bytes, Deadline deadline) {
  MpscRingHeader* h = ring_.h_;
  for (;;) {
    Result<MpscClaim> c = try_claim(payload_bytes);
    if (c.ok() || (c.code() != Errc::kFull && c.code() != Errc::kCorrupt) || deadline.passed())
      return c;
    if (c.code() == Errc::kCorrupt) {
      // The consumer repairs impossible indices at its next read: look again soon.
      Deadline soon = Deadline::after(std::chrono::milliseconds(1));
      if (deadline.ns() < soon.ns()) soon = deadline;
      wait_until(
          h->not_full, [] { return false; }, soon, 0);
      continue;
    }
    const uint64_t required =
        align_up(MpscRing::kRecordHeaderBytes + payload_bytes, MpscRing::kAlignment);
    // Wake when the record would fit, wrap padding included (a weaker test
    // would spin: free bytes split across the end do not make room).
    const bool room = wait_until(
        h->not_full,
        [&] {
          return ring_.fits(h->tail.load(std::memory_order_acquire),
                            h->head.load(std::memory_order_acquire), required);
        },
        deadline);
    if (!room) {
      return make_error(Errc::kTimeout,
                        fmt::format("ring stayed full until the deadline ({} bytes needed, {} of "
                                    "{} in use)",
                                    required, ring_.used_bytes(), ring_.capacity_));
    }
  }
}

Status MpscProducer::commit(const MpscClaim& claim, int32_t type) {
  KVRELAY_CHAOS_POINT();
  KVRELAY_FAULT_POINT("mpsc.written");
  uint64_t expected = claim.in_progress;
  const auto committed = hdr::pack(claim.record_length, static_cast<uint8_t>(type),
                                   static_cast<uint8_t>(slot_), static_cast<uint16_t>(generation_));
  const bool published =
      ring_.header_at(claim.offset)
          .compare_exchange_strong(expected, committed, std::memory_order_release,
                                   std::memory_order_relaxed);
  slot_ref().intent_bytes.store(0, std::memory_order_release);
  notify_waiters(ring_.h_->not_empty);
  if (!published)
    return make_error(Errc::kAborted,
                      "the ring's consumer gave this record up before it was committed (it judged "
                      "the producer dead, or the ring was reset); nothing was delivered");
  return {};
}

Status MpscProducer::try_write(int32_t type, std::span<const std::byte> payload) {
  return write(type, payload, Deadline::now());
}

Status MpscProducer::write(int32_t type, std::span<const std::byte> payload, Deadline deadline) {
  return write_with(
      type, payload.size(),
      [&](std::span<std::byte> out) {
        if (!payload.empty()) std::memcpy(out.data(), payload.data(), payload.size());
        return true;
      },
      deadline);
}

Status MpscProducer::write_with(int32_t type, size_t payload_bytes,
                                const std::function<bool(std::span<std::byte>)>& fill,
                                Deadline deadline) {
  if (type < MpscRing::kMinType || type > MpscRing::kMaxType)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("record type {} is outside [{}, {}]", type, MpscRing::kMinType,
                                  MpscRing::kMaxType));
  if (!leased_) return make_error(Errc::kInvalidArgument, "this producer was released");
  std::lock_guard lock(*mu_);
  Result<MpscClaim> c = claim(payload_bytes, deadline);
  if (!c) return c.error();
  if (!fill(c->payload)) {
    (void)commit(*c, mpsc_header::kPaddingType);  // never leave a claimed record behind
    return make_error(Errc::kInvalidArgument, "the record could not be written; nothing was sent");
  }
  return commit(*c, type);
}

ProducerSession MpscRing::session_state(uint32_t slot, uint32_t generation) const {
  if (slot >= kMpscProducerSlots) return ProducerSession::kDead;
  const MpscProducerSlot& s = h_->producers[slot];
  const auto low = [](uint32_t g) { return static_cast<uint16_t>(g); };
  if (low(s.released_generation.load(std::memory_order_acquire)) == low(generation))
    return ProducerSession::kReleased;
  if (low(s.generation.load(std::memory_order_acquire)) != low(generation))
    return ProducerSession::kDead;  // leased again since, without a clean release
  return producer_liveness(slot) == LockState::kFree ? ProducerSession::kDead
                                                     : ProducerSession::kAlive;
}

void MpscRing::acknowledge(uint32_t slot, uint32_t generation) {
  if (slot < kMpscProducerSlots)
    h_->producers[slot].acked_generation.store(generation, std::memory_order_release);
}

bool MpscRing::acknowledged(uint32_t slot, uint32_t generation) const {
  return slot < kMpscProducerSlots &&
         static_cast<uint16_t>(h_->producers[slot].acked_generation.load(
             std::memory_order_acquire)) == static_cast<uint16_t>(generation);
}

// ---------------------------------------------------------------------------
// The consumer

void MpscRing::note_corruption(std::string what) {
  h_->corrupt_events.fetch_add(1, std::memory_order_relaxed);
  if (corruption_.size() < kMaxCorruptionText) {
    if (!corruption_.empty()) corruption_ += "; ";
    corruption_ += what;
  }
}

std::optional<std::string> MpscRing::take_corruption() {
  if (corruption_.empty()) return std::nullopt;
  return std::exchange(corruption_, {});
}

// Our own copy of head; a shared head that disagrees was overwritten by
// somebody else (there is one consumer) and is put back.
uint64_t MpscRing::consumer_head() {
  const uint64_t shared = h_->head.load(std::memory_order_acquire);
  if (!head_known_) {
    head_ = shared;
    head_known_ = true;
    return head_;
  }
  if (shared != head_) {
    note_corruption(
        fmt::format("head was overwritten with {} (it was {}); restored", shared, head_));
    h_->head.store(head_, std::memory_order_release);
  }
  return head_;
}

// The tail is impossible (misaligned, behind head, or more than a ring
// ahead): rebuild it from what the producers have written since head, whole
// records and claims in progress, and from their intents. Producers claim
// nothing meanwhile (they refuse an impossible tail), so the walk is stable.
bool MpscRing::repair_tail(uint64_t head) {
  uint64_t seen = h_->tail.load(std::memory_order_acquire);
  if (sane(head, seen)) return true;
  if (head % kAlignment != 0) return false;  // our own copy is always aligned
  uint64_t pos = head;
  while (pos - head < capacity_) {
    const uint64_t index = pos & mask_;
    const int32_t length = hdr::length(header_at(index).load(std::memory_order_acquire));
    if (length == 0) break;
    const uint64_t n =
        align_up(static_cast<uint64_t>(length < 0 ? -int64_t{length} : length), kAlignment);
    if (n < kRecordHeaderBytes || n > capacity_ - index) break;
    pos += n;
  }
  for (const MpscProducerSlot& s : h_->producers) {
    const uint64_t bytes = s.intent_bytes.load(std::memory_order_acquire);
    const uint64_t at = s.intent_position.load(std::memory_order_relaxed);
    if (bytes == 0 || at < head || at % kAlignment != 0 || bytes % kAlignment != 0) continue;
    if (at - head <= capacity_ && bytes <= capacity_ - (at - head)) pos = std::max(pos, at + bytes);
  }
  if (!h_->tail.compare_exchange_strong(seen, pos, std::memory_order_acq_rel)) return false;
  note_corruption(
      fmt::format("tail was overwritten with {}; rebuilt as {} from the records", seen, pos));
  notify_waiters(h_->not_full);
  return true;
}

size_t MpscRing::read(const Handler& handler, size_t max_records) {
  uint64_t head = consumer_head();
  uint64_t tail = h_->tail.load(std::memory_order_acquire);
  if (!sane(head, tail)) {
    if (!repair_tail(head)) return 0;
    tail = h_->tail.load(std::memory_order_acquire);
    if (!sane(head, tail)) return 0;
  }
  const uint64_t start = head;
  size_t records = 0;
  while (records < max_records && head < tail) {
    const uint64_t index = head & mask_;
    const uint64_t word = header_at(index).load(std::memory_order_acquire);
    const int32_t length = hdr::length(word);
    if (length <= 0) {
      note_stall(head, tail);
      break;
    }
    KVRELAY_CHAOS_POINT();
    const uint64_t aligned = align_up(static_cast<uint64_t>(length), kAlignment);
    if (static_cast<uint64_t>(length) < kRecordHeaderBytes || aligned > capacity_ - index ||
        aligned > tail - head) {
      // Record boundaries from here on cannot be trusted: stop, and leave the
      // rest to the ring's owner.
      if (h_->state.exchange(static_cast<uint32_t>(MpscRingState::kCorrupt),
                             std::memory_order_acq_rel) !=
          static_cast<uint32_t>(MpscRingState::kCorrupt))
        note_corruption(
            fmt::format("the record at position {} claims {} bytes, impossible with "
                        "{} bytes written and {} before the end of the buffer; the "
                        "records from there on cannot be delimited",
                        head, length, tail - head, capacity_ - index));
      break;
    }
    const uint8_t type = hdr::type(word);
    if (type != hdr::kPaddingType) {
      const uint64_t payload = static_cast<uint64_t>(length) - kRecordHeaderBytes;
      MpscRecord r{head, type, hdr::producer(word), hdr::session(word),
                   std::span<const std::byte>(buffer_ + index + kRecordHeaderBytes, payload)};
      if (payload > max_payload_) {
        r.defect = "its payload exceeds the ring's record limit";
      } else if (type < kMinType) {
        r.defect = "its record type is 0";
      }
      if (r.defect != nullptr) h_->corrupt_records.fetch_add(1, std::memory_order_relaxed);
      handler(r);
      ++records;
    }
    head += aligned;
  }
  if (head != start) {
    // Zero before releasing, so that a producer's claim always starts from
    // zeroed headers (a zero length means "nothing written yet").
    KVRELAY_CHAOS_POINT();
    const uint64_t from = start & mask_;
    const uint64_t bytes = head - start;
    const uint64_t first = std::min(bytes, capacity_ - from);
    std::memset(buffer_ + from, 0, first);
    if (bytes > first) std::memset(buffer_, 0, bytes - first);
    KVRELAY_CHAOS_POINT();
    h_->records_read.fetch_add(records, std::memory_order_relaxed);
    head_ = head;
    h_->head.store(head, std::memory_order_release);
    notify_waiters(h_->not_full);
    if (stall_head_ != head && stall_head_ != UINT64_MAX) {
      stall_head_ = UINT64_MAX;
      h_->stalled_slot.store(0, std::memory_order_relaxed);
      h_->stalled_since_ns.store(0, std::memory_order_relaxed);
    }
  }
  return records;
}

bool MpscRing::readable() const {
  const uint64_t head = head_known_ ? head_ : h_->head.load(std::memory_order_acquire);
  if (head % kAlignment != 0) return false;
  // The header first: a consumer spinning here while the ring is empty then
  // reads only the line the next record's producer writes anyway, not
  // `tail`, which every producer CASes per record (reading it in the spin
  // made each claim take that line back from the consumer's core).
  if (hdr::length(header_at(head & mask_).load(std::memory_order_acquire)) <= 0) return false;
  return head < h_->tail.load(std::memory_order_acquire);
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
        h_->not_empty, [&] { return readable(); }, until);
  }
}

bool MpscRing::wait_readable(Deadline deadline) {
  return wait_until(
      h_->not_empty, [&] { return readable(); }, deadline);
}

// The record at `head` is claimed but not committed. After the stall
// timeout, and every quarter of it after that, look for the producers that
// may own it; give it up once every one of them is proven dead.
void MpscRing::note_stall(uint64_t head, uint64_t tail) {
  const uint64_t now = mono_now_ns();
  const auto timeout = static_cast<uint64_t>(stall_timeout_.count());
  if (stall_head_ != head) {
    stall_head_ = head;
    stall_since_ns_ = now;
    next_stall_check_ns_ = now + timeout;
    return;
  }
  if (now < next_stall_check_ns_) return;
  next_stall_check_ns_ = now + std::max<uint64_t>(timeout / 4, 1);
  h_->stalled_since_ns.store(stall_since_ns_, std::memory_order_relaxed);

  const uint64_t word = header_at(head & mask_).load(std::memory_order_acquire);
  const int32_t length = hdr::length(word);
  if (length > 0) return;  // committed meanwhile

  // Who may own it: the producer named in an in-progress header, or, before
  // the header was written, every producer whose intent covers it.
  bool any_owner = false;
  bool all_dead = true;
  uint32_t live_owner = 0;
  auto judge = [&](uint32_t slot) {
    any_owner = true;
    if (producer_liveness(slot) != LockState::kFree) {
      all_dead = false;
      live_owner = slot + 1;
    }
  };
  if (length < 0) {
    const uint32_t owner = hdr::producer(word);
    if (owner < kMpscProducerSlots) {
      const uint16_t leased =
          static_cast<uint16_t>(h_->producers[owner].generation.load(std::memory_order_acquire));
      if (leased == hdr::session(word)) {
        judge(owner);
      } else {
        any_owner = true;  // the slot was leased again since: its writer is gone
      }
    }
  } else {
    for (uint32_t i = 0; i < kMpscProducerSlots; ++i) {
      const MpscProducerSlot& s = h_->producers[i];
      const uint64_t bytes = s.intent_bytes.load(std::memory_order_acquire);
      const uint64_t at = s.intent_position.load(std::memory_order_relaxed);
      if (bytes != 0 && at <= head && head - at < bytes) judge(i);
    }
  }
  if (!all_dead) {
    h_->stalled_slot.store(live_owner, std::memory_order_relaxed);
    return;
  }
  if (!any_owner && now - stall_since_ns_ < kOrphanStallFactor * timeout) return;
  if (unblock(head, tail, word)) {
    h_->skipped_records.fetch_add(1, std::memory_order_relaxed);
    if (!any_owner)
      note_corruption(fmt::format("a claim at position {} had no producer; given up after {} ms",
                                  head, (now - stall_since_ns_) / 1'000'000));
    stall_head_ = UINT64_MAX;
    h_->stalled_slot.store(0, std::memory_order_relaxed);
    h_->stalled_since_ns.store(0, std::memory_order_relaxed);
  }
}

// Turns the dead claim at head into padding (Aeron's unblock): a CAS of the
// header word we judged, so that nothing else can be lost if it changed.
bool MpscRing::unblock(uint64_t head, uint64_t tail, uint64_t word) {
  const uint64_t index = head & mask_;
  const uint64_t limit = std::min(capacity_ - index, tail - head);  // never past the end or tail
  uint64_t pad = 0;
  const int32_t length = hdr::length(word);
  if (length < 0) {
    pad = align_up(static_cast<uint64_t>(-int64_t{length}), kAlignment);
  } else {
    // The smallest extent any dead intent covering it gives: a larger one
    // might swallow a later record; a smaller remainder is given up next time.
    pad = UINT64_MAX;
    for (const MpscProducerSlot& s : h_->producers) {
      const uint64_t bytes = s.intent_bytes.load(std::memory_order_acquire);
      const uint64_t at = s.intent_position.load(std::memory_order_relaxed);
      if (bytes != 0 && at <= head && head - at < bytes) pad = std::min(pad, at + bytes - head);
    }
    if (pad == UINT64_MAX) {
      // No intent: it ends where the next header starts (everything before
      // must still be zero), or at the limit.
      pad = limit;
      for (uint64_t i = kAlignment; i < limit; i += kAlignment) {
        if (header_at(index + i).load(std::memory_order_acquire) != 0) {
          pad = i;
          break;
        }
      }
    }
  }
  pad = std::clamp<uint64_t>(pad, kRecordHeaderBytes, std::max<uint64_t>(limit, kAlignment));
  uint64_t expected = word;
  return header_at(index).compare_exchange_strong(
      expected, hdr::pack(static_cast<int32_t>(pad), hdr::kPaddingType, hdr::kNoProducer, 0),
      std::memory_order_release);
}

uint64_t MpscRing::reset() {
  const uint64_t head = h_->head.load(std::memory_order_acquire);
  const uint64_t tail = h_->tail.load(std::memory_order_acquire);
  const uint64_t at = align_up(sane(head, tail) ? tail : std::max(head, head_), kAlignment);
  const uint64_t dropped = sane(head, tail) ? tail - head : 0;
  std::memset(buffer_, 0, capacity_);
  for (MpscProducerSlot& s : h_->producers)
    s.intent_bytes.store(0, std::memory_order_relaxed);
  h_->tail.store(at, std::memory_order_release);
  h_->head_cache.store(at, std::memory_order_release);
  h_->head.store(at, std::memory_order_release);
  h_->state.store(static_cast<uint32_t>(MpscRingState::kOk), std::memory_order_release);
  h_->stalled_slot.store(0, std::memory_order_relaxed);
  h_->stalled_since_ns.store(0, std::memory_order_relaxed);
  head_ = at;
  head_known_ = true;
  stall_head_ = UINT64_MAX;
  notify_waiters(h_->not_full);
  return dropped;
}

std::vector<MpscRing::PeekedRecord> MpscRing::peek(size_t max_records) const {
  std::vector<PeekedRecord> out;
  const uint64_t head = h_->head.load(std::memory_order_acquire);
  const uint64_t tail = h_->tail.load(std::memory_order_acquire);
  if (!sane(head, tail)) return out;
  for (uint64_t pos = head; out.size() < max_records && pos < tail;) {
    const uint64_t index = pos & mask_;
    const uint64_t word = header_at(index).load(std::memory_order_acquire);
    const int32_t length = hdr::length(word);
    if (length <= 0) break;  // not committed yet
    const uint64_t aligned = align_up(static_cast<uint64_t>(length), kAlignment);
    if (static_cast<uint64_t>(length) < kRecordHeaderBytes || aligned > capacity_ - index ||
        aligned > tail - pos)
      break;
    if (hdr::type(word) != hdr::kPaddingType) {
      PeekedRecord r{pos, hdr::type(word), hdr::producer(word), {}};
      r.payload.resize(
          std::min<uint64_t>(static_cast<uint64_t>(length) - kRecordHeaderBytes, max_payload_));
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

}  // namespace kvrelay
