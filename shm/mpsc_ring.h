// Variable-length multi-producer, single-consumer byte ring in shared memory.
//
// The model is Aeron's many-to-one ring buffer (aeron_mpsc_rb.c):
//
//   record   = [int32 length][int32 type][payload ...] padded to 8 bytes
//   length   = header + payload bytes (unpadded)
//
//   producer: claim space by CAS on `tail`; write the header with a negative
//             length (in progress; `type` holds the producer's pid meanwhile);
//             write the payload; store the real type; release-store the
//             positive length (commit).
//   wrap:     a claim that does not fit before the end of the buffer first
//             claims the rest of the buffer as a padding record.
//   consumer: read records from `head` while their length is positive; zero
//             what it read; release-store the new head.
//
// A producer that dies between claim and commit leaves a record the consumer
// cannot pass. After `stall_timeout` (longer while the pid recorded in the
// record is still alive), the consumer turns it into padding and moves on;
// `skipped_records` counts it. Nothing else is lost.
//
// A full ring never overwrites: try_ calls return kFull (and count it),
// blocking calls wait on a futex until room appears or the deadline passes.
//
// Who may call what: any number of producer processes may claim/commit/write
// concurrently; exactly one consumer process calls read. Payload pointers
// handed to the consumer's handler are valid only during the call, and point
// into shared memory that a hostile producer could still be scribbling on:
// decode defensively.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <type_traits>
#include <vector>

#include "shm/clock.h"
#include "shm/result.h"
#include "shm/wait_event.h"

namespace kvrelay {

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
  std::atomic<uint64_t> skipped_records;          // consumer: dead producers' records skipped
  std::atomic<uint64_t> corrupt_records;          // consumer: impossible lengths found
  uint8_t reserved2[32];

  WaitEvent not_empty;  // the consumer parks here
  WaitEvent not_full;   // producers park here
};
static_assert(std::is_standard_layout_v<MpscRingHeader>);
static_assert(sizeof(MpscRingHeader) == 448);
static_assert(offsetof(MpscRingHeader, tail) == 64);
static_assert(offsetof(MpscRingHeader, head) == 192);

struct MpscRecordHeader {
  std::atomic<int32_t> length;  // > 0 committed; < 0 in progress; 0 nothing yet
  std::atomic<int32_t> type;    // > 0 user type; kPaddingType; pid while in progress
};
static_assert(sizeof(MpscRecordHeader) == 8);

// A claimed, not yet committed record. Fill `payload`, then commit or abort.
struct MpscClaim {
  uint64_t offset = 0;  // record offset in the record area
  int32_t record_length = 0;
  std::span<std::byte> payload;
};

class MpscRing {
 public:
  static constexpr int32_t kPaddingType = -1;
  static constexpr size_t kAlignment = 8;
  static constexpr size_t kRecordHeaderBytes = sizeof(MpscRecordHeader);
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
  // Validates the geometry before trusting it.
  static Result<MpscRing> attach(void* region, size_t region_bytes);

  // ---- producers (any process) ----

  // Claims room for `payload_bytes`; kFull when there is none, kTooLarge
  // when the payload exceeds max_payload_bytes.
  Result<MpscClaim> try_claim(size_t payload_bytes);
  Result<MpscClaim> claim(size_t payload_bytes, Deadline deadline);
  // Publishes a claimed record with `type` (> 0).
  void commit(const MpscClaim& claim, int32_t type);
  // Gives a claimed record up; the consumer skips it.
  void abort(const MpscClaim& claim);

  Status try_write(int32_t type, std::span<const std::byte> payload);
  Status write(int32_t type, std::span<const std::byte> payload, Deadline deadline);

  // ---- the consumer (one process) ----

  using Handler = std::function<void(int32_t type, std::span<const std::byte> payload)>;

  // Hands up to `max_records` committed records to `handler`, in ring order.
  // Returns how many were handed over. Also skips stalled records (see top).
  size_t read(const Handler& handler, size_t max_records = SIZE_MAX);
  // Like read, but waits until at least one record arrives or `deadline`.
  size_t read_wait(const Handler& handler, size_t max_records, Deadline deadline);
  // Waits until a committed record is waiting (true) or `deadline` (false),
  // without consuming it.
  bool wait_readable(Deadline deadline);
  // Whether a committed record waits at the head (a claim that is not yet
  // committed does not count: a consumer must not spin on a dead producer's).
  bool readable() const { return has_committed_record(); }

  // How long a half-written record may block the consumer before it is
  // skipped when its producer is dead; a live producer gets 4x as long.
  void set_stall_timeout(Nanos timeout) { stall_timeout_ = timeout; }

  // ---- anyone (observers such as kvrelay-dump) ----

  // Copies up to `max_records` committed records from head onwards, without
  // consuming them or writing anything. The consumer may move on meanwhile:
  // a record whose bytes may have changed while being copied is dropped, and
  // the walk stops there. Every length is bounds-checked.
  struct PeekedRecord {
    uint64_t position;  // ring position (monotonic) of the record
    int32_t type;
    std::vector<std::byte> payload;
  };
  std::vector<PeekedRecord> peek(size_t max_records) const;

  uint64_t capacity() const { return capacity_; }
  uint32_t max_payload_bytes() const { return h_->max_payload_bytes; }
  uint64_t used_bytes() const;  // snapshot
  const MpscRingHeader& header() const { return *h_; }

 private:
  explicit MpscRing(MpscRingHeader* h);
  MpscRecordHeader& record_at(uint64_t offset) const {
    return *reinterpret_cast<MpscRecordHeader*>(buffer_ + offset);
  }
  bool fits(uint64_t tail, uint64_t head, uint64_t required) const;
  bool sane(uint64_t head, uint64_t tail) const;
  size_t read_contiguous(const Handler& handler, size_t max_records, bool& progressed);
  bool has_committed_record() const;
  void note_stall();
  bool unblock();

  MpscRingHeader* h_;
  std::byte* buffer_;
  uint64_t capacity_;
  uint64_t mask_;
  // Consumer-local: when the record at head was first seen blocked.
  uint64_t stall_head_ = UINT64_MAX;
  uint64_t stall_since_ns_ = 0;
  Nanos stall_timeout_ = std::chrono::seconds(1);
};

}  // namespace kvrelay
