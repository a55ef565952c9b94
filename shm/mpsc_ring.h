// Variable-length multi-producer, single-consumer byte ring in shared memory.
//
// The model is Aeron's many-to-one ring buffer (aeron_mpsc_rb.c), hardened
// so that a producer that pauses or dies, or a process that scribbles on the
// ring, costs at most its own records:
//
//   record   = [header: one 64-bit word][payload ...] padded to 8 bytes
//   header   = length (int32, header included, unpadded) | type (8 bits)
//              | producer slot (8 bits) | session (16 bits)
//              length > 0 committed; < 0 claimed and being written; 0 nothing yet
//
//   producer: lease a producer slot once (an owner lock on the slot, see
//             owner_lock.h); per record, publish an intent (the position and
//             size about to be claimed) in the slot, claim by CAS on `tail`,
//             store an in-progress header (-length), write the payload, and
//             commit with a CAS of the whole header word to +length. The CAS
//             fails only if the consumer gave the record up (its producer was
//             judged dead): the producer then gets an error, never "success"
//             for a record nobody will read.
//   wrap:     a claim that does not fit before the end of the buffer first
//             claims the rest of the buffer as a padding record.
//   consumer: read records from `head`, never past the tail it loaded; zero
//             what it read; release-store the new head.
//
// A claim that stays uncommitted blocks the consumer. It is given up (turned
// into padding, counted in `skipped_records`) only once every producer that
// could own it is proven dead: its slot's owner lock is free. The owner is
// found through the in-progress header, or, when the producer died between
// its CAS and its header store, through the intents. A producer that is only
// paused (SIGSTOP, a debugger, swap) keeps its lock and loses nothing, however
// long it pauses.
//
// Shared state is input: the consumer keeps its own copy of head and restores
// the shared one if something overwrote it; an impossible tail is rebuilt
// from the records and intents; a record whose length exceeds the payload
// limit but whose boundaries are sound is handed over flagged as defective
// (it costs that record only); a record whose boundaries cannot be trusted
// stops the consumer and marks the ring corrupt, for its owner to act on.
// Every such event is counted in the header (kvrelay-dump shows it) and
// described once through take_corruption().
//
// A full ring never overwrites: try_ calls return kFull (and count it),
// blocking calls wait on a futex until room appears or the deadline passes.
//
// Who may call what: any number of producer processes, each through its own
// MpscProducer (any of its threads); exactly one consumer, through one
// MpscRing object. Payload pointers handed to the consumer are valid only
// during the call and point into memory another process could still scribble
// on: decode defensively.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "shm/clock.h"
#include "shm/owner_lock.h"
#include "shm/result.h"
#include "shm/wait_event.h"

namespace kvrelay {

inline constexpr uint32_t kMpscProducerSlots = 128;

// One per producer process attachment. The slot's owner lock (at the slot's
// own file offset) says whether its producer lives. One cache line each, so
// that producers publishing intents do not share lines.
struct alignas(64) MpscProducerSlot {
  std::atomic<uint64_t> intent_position;  // ring position of the claim being made
  std::atomic<uint64_t> intent_bytes;     // bytes it claims, padding included; 0: none
  std::atomic<uint32_t> generation;       // bumped by each lease: tells sessions apart
  std::atomic<uint32_t> pid;              // the leaser, for people (never trusted)
  std::atomic<uint32_t> state;            // MpscSlotState, written by the leaser
  // The generation that was released cleanly last (written by the leaser as
  // it lets the slot go): a producer that left, rather than died.
  std::atomic<uint32_t> released_generation;
  // Written by the consumer: the newest generation it has acknowledged (the
  // ring's owner decides what that means; the coordinator acknowledges a
  // session's hello once the requests of dead sessions are withdrawn).
  std::atomic<uint32_t> acked_generation;
  uint8_t reserved[28];
};
static_assert(sizeof(MpscProducerSlot) == 64);

enum class MpscSlotState : uint32_t {
  kFree = 0,
  kLeased = 1,    // a producer holds it (its lock says whether it still lives)
  kReleased = 2,  // its producer let it go cleanly
};

enum class MpscRingState : uint32_t {
  kOk = 0,
  kCorrupt = 1,  // the consumer found record boundaries it cannot trust
};

struct MpscRingHeader {
  // Geometry, written by the creator before publication, read-only afterwards.
  uint64_t capacity;           // bytes in the record area; a power of two
  uint32_t max_payload_bytes;  // largest payload a single record may carry
  uint32_t reserved0;
  uint8_t reserved1[48];

  alignas(64) std::atomic<uint64_t> tail;        // producers claim by CAS
  alignas(64) std::atomic<uint64_t> head_cache;  // producers' shared, possibly stale, copy of head
  alignas(64) std::atomic<uint64_t> head;        // consumer only

  // Statistics; producers add with fetch_add, the consumer owns its own.
  alignas(64) std::atomic<uint64_t> full_events;  // claims refused for lack of room
  std::atomic<uint64_t> records_read;             // consumer
  std::atomic<uint64_t> skipped_records;          // consumer: dead producers' claims given up
  std::atomic<uint64_t> corrupt_records;   // consumer: defective records passed on or dropped
  std::atomic<uint64_t> corrupt_events;    // impossible shared state found (any side)
  std::atomic<uint32_t> state;             // MpscRingState, consumer
  std::atomic<uint32_t> stalled_slot;      // consumer: producer slot blocking head (+1), 0: none
  std::atomic<uint64_t> stalled_since_ns;  // consumer: CLOCK_MONOTONIC since when; 0: not
  uint8_t reserved2[8];

  WaitEvent not_empty;  // the consumer parks here
  WaitEvent not_full;   // producers park here
  // The consumer's lease, on rings whose readers take one (lease_consumer):
  // its owner lock, at this line's file offset, proves the reader lives.
  // Written by the leaser, for people and error messages (never trusted).
  alignas(64) std::atomic<uint32_t> consumer_pid;
  std::atomic<uint32_t> consumer_tag;         // the leaser's name for itself (an engine session)
  std::atomic<uint32_t> consumer_generation;  // bumped by each lease
  uint8_t reserved3[52];
  MpscProducerSlot producers[kMpscProducerSlots];
};
static_assert(std::is_standard_layout_v<MpscRingHeader>);
static_assert(sizeof(MpscRingHeader) == 512 + kMpscProducerSlots * sizeof(MpscProducerSlot));
static_assert(offsetof(MpscRingHeader, tail) == 64);
static_assert(offsetof(MpscRingHeader, head) == 192);
static_assert(offsetof(MpscRingHeader, consumer_pid) == 448);
static_assert(offsetof(MpscRingHeader, producers) == 512);

// How a producer session stands, judged by its slot: still producing, gone
// cleanly (released), or gone without a word (died).
enum class ProducerSession { kAlive, kReleased, kDead };

// The record header word.
namespace mpsc_header {
inline constexpr uint8_t kPaddingType = 0xFF;
inline constexpr uint8_t kNoProducer = 0xFF;
constexpr uint64_t pack(int32_t length, uint8_t type, uint8_t producer, uint16_t session) {
  return uint64_t{static_cast<uint32_t>(length)} | (uint64_t{type} << 32) |
         (uint64_t{producer} << 40) | (uint64_t{session} << 48);
}
constexpr int32_t length(uint64_t w) {
  return static_cast<int32_t>(static_cast<uint32_t>(w));
}
constexpr uint8_t type(uint64_t w) {
  return static_cast<uint8_t>(w >> 32);
}
constexpr uint8_t producer(uint64_t w) {
  return static_cast<uint8_t>(w >> 40);
}
constexpr uint16_t session(uint64_t w) {
  return static_cast<uint16_t>(w >> 48);
}
}  // namespace mpsc_header

// A record as the consumer sees it.
struct MpscRecord {
  uint64_t position;  // ring position (monotonic)
  int32_t type;       // 1..254
  uint32_t producer;  // the producer slot that wrote it
  uint16_t session;   // the low 16 bits of that slot's generation when it was written
  std::span<const std::byte> payload;
  // nullptr for a sound record; otherwise what is wrong with it (its payload
  // exceeds the ring's limit). The record's boundaries were sound, so only
  // this record is affected.
  const char* defect = nullptr;
};

// A claimed, not yet committed record. Fill `payload`, then commit or abort.
struct MpscClaim {
  uint64_t offset = 0;       // record offset in the record area
  uint64_t in_progress = 0;  // the header word the claim left; commit CASes from it
  int32_t record_length = 0;
  std::span<std::byte> payload;
};

class MpscProducer;
class MpscConsumerLease;

// Who holds a ring's consumer lease (MpscRing::consumer_holder).
struct MpscConsumerHolder {
  uint32_t pid = 0;  // as the leaser wrote it (for people)
  uint32_t tag = 0;  // the leaser's name for itself
};

class MpscRing {
 public:
  static constexpr int32_t kMinType = 1;
  static constexpr int32_t kMaxType = 254;
  static constexpr size_t kAlignment = 8;
  static constexpr size_t kRecordHeaderBytes = 8;
  // Lengths are int32 in the record header, so the ring stays below 2 GiB.
  static constexpr uint64_t kMaxCapacity = uint64_t{1} << 30;

  static constexpr size_t bytes_for(uint64_t capacity) { return sizeof(MpscRingHeader) + capacity; }
  // The default largest payload: an eighth of the ring, as in Aeron.
  static constexpr uint32_t default_max_payload(uint64_t capacity) {
    return static_cast<uint32_t>(capacity / 8 - kRecordHeaderBytes);
  }

  // Creator only, on zeroed memory, before the segment is published.
  static Status initialize(void* region, size_t region_bytes, uint64_t capacity,
                           uint32_t max_payload_bytes);
  // Validates the geometry before trusting it. `locks`: where the producer
  // slots' owner locks live (the segment's file at the region's offset).
  static Result<MpscRing> attach(void* region, size_t region_bytes, LockSpace locks = {});

  // ---- producers ----

  // Leases a producer slot for this attachment (see MpscProducer). kBusy
  // when every slot is held by a live process.
  Result<MpscProducer> lease_producer() const;

  // ---- the consumer (one process) ----

  // On rings where readers in several processes could appear (the
  // completion ring: any engine process may call poll), the one reader takes
  // the consumer lease first; the lease lasts until the MpscConsumerLease is
  // destroyed or its process dies. kBusy, naming the holder's pid and tag,
  // when another live process holds it (or another object of this process
  // does). `tag`: the leaser's name for itself, shown to whoever is refused.
  Result<MpscConsumerLease> lease_consumer(uint32_t tag) const;
  // The live holder of the consumer lease; nullopt when nobody holds it (or
  // the ring has no lock file, where nobody can be proven alive).
  std::optional<MpscConsumerHolder> consumer_holder() const;

  using Handler = std::function<void(const MpscRecord& record)>;

  // Hands up to `max_records` committed records to `handler`, in ring order.
  // Returns how many were handed over. Also gives up dead producers' claims
  // and repairs what it can (see the top).
  size_t read(const Handler& handler, size_t max_records = SIZE_MAX);
  // Like read, but waits until at least one record arrives or `deadline`.
  size_t read_wait(const Handler& handler, size_t max_records, Deadline deadline);
  // Waits until a committed record is waiting (true) or `deadline` (false),
  // without consuming it.
  bool wait_readable(Deadline deadline);
  // Whether a committed record waits at the head (a claim that is not yet
  // committed does not count: a consumer must not spin on a paused producer).
  bool readable() const;

  // How long a claim may block the consumer before its producers' liveness is
  // checked (and again every quarter of it while they live).
  void set_stall_timeout(Nanos timeout) { stall_timeout_ = timeout; }

  // What the consumer found wrong since the last call (nullopt: nothing), for
  // the owner's log; the header counters keep the totals.
  std::optional<std::string> take_corruption();
  bool corrupt() const {
    return h_->state.load(std::memory_order_acquire) ==
           static_cast<uint32_t>(MpscRingState::kCorrupt);
  }

  // Owner only, when no consumer runs (its process is dead) and no producer
  // can be mid-claim (the owner is the only producer, e.g. a worker's task
  // ring): drops every record, zeroes the buffer, and clears the corrupt
  // state. Returns the bytes dropped.
  uint64_t reset();

  // ---- anyone (observers such as kvrelay-dump) ----

  // Copies up to `max_records` committed records from head onwards, without
  // consuming them or writing anything. The consumer may move on meanwhile:
  // a record whose bytes may have changed while being copied is dropped, and
  // the walk stops there. Every length is bounds-checked.
  struct PeekedRecord {
    uint64_t position;
    int32_t type;
    uint32_t producer;
    std::vector<std::byte> payload;
  };
  std::vector<PeekedRecord> peek(size_t max_records) const;
  // Whether head and tail make sense together (aligned, head <= tail, at
  // most a ring apart): false means somebody scribbled on them.
  bool indices_sane() const;

  uint64_t capacity() const { return capacity_; }
  uint32_t max_payload_bytes() const { return max_payload_; }
  uint64_t used_bytes() const;  // snapshot
  const MpscRingHeader& header() const { return *h_; }
  const LockSpace& locks() const { return locks_; }
  // The file offset of producer slot `i`'s owner lock, relative to locks().
  static uint64_t producer_lock_offset(uint32_t i) {
    return offsetof(MpscRingHeader, producers) + uint64_t{i} * sizeof(MpscProducerSlot);
  }
  static constexpr uint64_t kConsumerLockOffset = offsetof(MpscRingHeader, consumer_pid);
  // Whether producer slot `i`'s owner still lives.
  LockState producer_liveness(uint32_t i) const { return locks_.probe(producer_lock_offset(i)); }
  // How the session that leased slot `slot` as `generation` stands (compared
  // on the low 16 bits, as records carry them).
  ProducerSession session_state(uint32_t slot, uint32_t generation) const;
  // Consumer-side acknowledgement of a session (see acked_generation).
  void acknowledge(uint32_t slot, uint32_t generation);
  bool acknowledged(uint32_t slot, uint32_t generation) const;

 private:
  friend class MpscProducer;
  MpscRing(MpscRingHeader* h, LockSpace locks);
  std::atomic<uint64_t>& header_at(uint64_t offset) const {
    return *reinterpret_cast<std::atomic<uint64_t>*>(buffer_ + offset);
  }
  bool fits(uint64_t tail, uint64_t head, uint64_t required) const;
  bool sane(uint64_t head, uint64_t tail) const;
  uint64_t consumer_head();
  bool repair_tail(uint64_t head);
  void note_corruption(std::string what);
  void note_stall(uint64_t head, uint64_t tail);
  bool unblock(uint64_t head, uint64_t tail, uint64_t word);

  MpscRingHeader* h_;
  std::byte* buffer_;
  uint64_t capacity_;
  uint64_t mask_;
  uint32_t max_payload_;
  LockSpace locks_;
  // Consumer-local.
  uint64_t head_ = 0;  // our own copy of head; the shared one is restored from it
  bool head_known_ = false;
  uint64_t stall_head_ = UINT64_MAX;  // when the record at head was first seen blocked
  uint64_t stall_since_ns_ = 0;
  uint64_t next_stall_check_ns_ = 0;
  Nanos stall_timeout_ = std::chrono::seconds(1);
  std::string corruption_;
};

// A process's right to read a ring whose readers take a lease (see
// MpscRing::lease_consumer). Move-only; the lease ends with the object.
class MpscConsumerLease {
 public:
  MpscConsumerLease(MpscConsumerLease&& other) noexcept
      : locks_(other.locks_), header_(std::exchange(other.header_, nullptr)) {}
  MpscConsumerLease& operator=(MpscConsumerLease&& other) noexcept {
    if (this != &other) {
      release();
      locks_ = other.locks_;
      header_ = std::exchange(other.header_, nullptr);
    }
    return *this;
  }
  MpscConsumerLease(const MpscConsumerLease&) = delete;
  MpscConsumerLease& operator=(const MpscConsumerLease&) = delete;
  ~MpscConsumerLease() { release(); }

 private:
  friend class MpscRing;
  MpscConsumerLease(LockSpace locks, MpscRingHeader* header) : locks_(locks), header_(header) {}
  void release();

  LockSpace locks_;
  MpscRingHeader* header_ = nullptr;
};

// A process's right to write into one ring: a leased producer slot. The lease
// (the slot's owner lock) lasts until the MpscProducer is destroyed or the
// process dies; while it lasts, the consumer never gives up a claim of ours.
// Thread-safe: the threads of a process share one MpscProducer (claims are
// serialized inside it, because the slot holds one intent at a time).
class MpscProducer {
 public:
  MpscProducer(MpscProducer&&) noexcept;
  MpscProducer& operator=(MpscProducer&&) noexcept;
  ~MpscProducer();

  uint32_t slot() const { return slot_; }
  // Whether the consumer acknowledged this lease (see acked_generation).
  bool acknowledged() const { return ring_.acknowledged(slot_, generation_); }
  uint32_t generation() const { return generation_; }
  uint32_t max_payload_bytes() const { return ring_.max_payload_bytes(); }
  const MpscRing& ring() const { return ring_; }

  // Writes one record of `type` (1..254). kFull (try_) / kTimeout (blocking)
  // when there is no room, kTooLarge past the payload limit, kCorrupt when the
  // ring's shared state is impossible, kAborted when the consumer gave the
  // record up before it was committed (nothing was delivered).
  Status try_write(int32_t type, std::span<const std::byte> payload);
  Status write(int32_t type, std::span<const std::byte> payload, Deadline deadline);
  // As write(), with the payload serialized in place by `fill`, which fills
  // exactly `payload_bytes` bytes and returns true, or returns false to give
  // the record up (it becomes padding; kInvalidArgument).
  Status write_with(int32_t type, size_t payload_bytes,
                    const std::function<bool(std::span<std::byte>)>& fill, Deadline deadline);

  // Low level, for tests: a claim left uncommitted (as a producer that died
  // or paused mid-write would leave it). The caller commits or aborts it.
  Result<MpscClaim> claim_for_test(size_t payload_bytes) { return try_claim(payload_bytes); }
  Status commit_for_test(const MpscClaim& c, int32_t type) { return commit(c, type); }

  // Lets the slot go cleanly (also done by the destructor): the consumer
  // learns that this producer left, rather than died.
  void release();

  // For a ring with no other producer (the coordinator's task and completion
  // rings): keep our own copy of the tail and put the shared one back if
  // another process overwrote it.
  void set_sole_producer() { sole_ = true; }
  // A sole producer's MpscRing::reset() (when the consumer is dead): drops
  // every record. Returns the bytes dropped.
  uint64_t reset_ring() {
    tail_ = UINT64_MAX;
    return ring_.reset();
  }
  // What a sole producer found overwritten since the last call.
  std::optional<std::string> take_corruption() {
    if (corruption_.empty()) return std::nullopt;
    return std::exchange(corruption_, {});
  }

 private:
  friend class MpscRing;
  MpscProducer(MpscRing ring, uint32_t slot, uint32_t generation);
  Result<MpscClaim> try_claim(size_t payload_bytes);
  Result<MpscClaim> claim(size_t payload_bytes, Deadline deadline);
  Status commit(const MpscClaim& claim, int32_t type);
  bool clear_stray_header(uint64_t offset, uint64_t tail);
  MpscProducerSlot& slot_ref() const { return ring_.h_->producers[slot_]; }

  MpscRing ring_;
  uint32_t slot_ = 0;
  uint32_t generation_ = 0;
  bool leased_ = false;
  bool sole_ = false;
  uint64_t tail_ = UINT64_MAX;  // sole producer: where the tail must be
  std::string corruption_;
  std::unique_ptr<std::mutex> mu_;
};

}  // namespace kvrelay
