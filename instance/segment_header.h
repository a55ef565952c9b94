// The header at offset 0 of every kvrelay segment.
//
// Two parts:
//  - SegmentPreamble keeps its fields at the same offsets in every layout
//    version, so that any build of kvrelay can say what a segment is, which
//    version wrote it, and whether its creator still lives, before it decides
//    whether it may read the rest.
//  - SegmentHeader adds the epoch, the state, the instance configuration and
//    the region directory: (kind, index) -> (offset, bytes). Everything in a
//    segment is reached by offset from the mapping's base, never by pointer.
//
// Publication: the creator writes everything, then stores `magic` with
// release semantics; an attacher loads `magic` with acquire semantics and
// reads nothing else until it matches (iceoryx2 does the same with its
// version field).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "instance/instance_config.h"
#include "instance/instance_status.h"
#include "instance/request_stalls.h"
#include "instance/swap_progress.h"
#include "shm/barrier.h"
#include "shm/counters.h"
#include "shm/claim_table.h"
#include "shm/liveness.h"
#include "shm/mpsc_ring.h"
#include "shm/result.h"
#include "shm/spsc_ring.h"
#include "shm/wait_event.h"

namespace kvrelay {

// "KVRELAY" + format generation byte.
inline constexpr uint64_t kSegmentMagic = 0x01'59'41'4C'45'52'56'4BULL;
// Bumped when a layout changes in a way the hash below cannot see (4: the
// spsc rings keep their state words apart from their records).
inline constexpr uint32_t kLayoutVersion = 4;
inline constexpr uint32_t kMaxRegions = 96;
inline constexpr size_t kRegionAlignment = 256;

enum class SegmentKind : uint32_t { kControl = 1, kPool = 2 };

enum class InstanceState : uint32_t {
  kInitialising = 0,  // created, workers not lined up yet
  kReady = 1,         // serving
  kDraining = 2,      // shutting down: no new requests
  kDead = 3,          // the coordinator exited cleanly (segment about to be unlinked)
};
const char* instance_state_name(uint32_t state);

struct SegmentPreamble {
  std::atomic<uint64_t> magic;  // kSegmentMagic, stored last (release)
  uint32_t layout_version;
  uint32_t kind;  // SegmentKind
  uint64_t layout_hash;
  uint64_t segment_bytes;
  uint32_t creator_pid;
  uint32_t creator_uid;
  uint64_t creator_start_time;  // clock ticks after boot
  char boot_id[40];             // NUL-terminated
  uint8_t reserved[8];          // the creator's pid namespace (inode, u64), for messages
};
static_assert(std::is_standard_layout_v<SegmentPreamble>);
static_assert(sizeof(SegmentPreamble) == 96);
static_assert(offsetof(SegmentPreamble, layout_version) == 8);
static_assert(offsetof(SegmentPreamble, layout_hash) == 16);
static_assert(offsetof(SegmentPreamble, creator_pid) == 32);
static_assert(offsetof(SegmentPreamble, boot_id) == 48);

enum class RegionKind : uint32_t {
  kLiveness = 1,        // LivenessSlot[1 + tp]: coordinator, then ranks
  kCounters = 2,        // CountersBlock[2 + tp]: coordinator, clients (shared), then ranks
  kBarrier = 3,         // BarrierState: the TP barrier
  kSubmitRing = 4,      // MpscRing: clients -> coordinator
  kCompletionRing = 5,  // MpscRing: coordinator -> engine
  kTaskRing = 6,        // MpscRing per rank: coordinator -> worker
  kSignalRing = 7,      // SpscRing per rank: engine -> worker (layer signals)
  kReportRing = 8,      // SpscRing per rank: worker -> coordinator
  kStatus = 9,          // InstanceStatus: ready flags and doorbells
  kPoolDirectory = 10,  // PoolDirectory: where each rank's pools live
  kSwapProgress = 11,   // SwapProgressTable: per-layer progress of swap loads
  kClaimTable = 12,    // ClaimTable per rank (decode role): claims on its pool's blocks
  kLandedRing = 13,     // MpscRing per rank (decode role): ipc writers -> worker (what landed)
  kRequestStalls = 14,  // StallBoard: each rank's stalled requests, for kvrelay-dump
};

// The landed ring's size: its records say which runs of a layer landed.
inline constexpr uint64_t kLandedRingBytes = 256 * 1024;
// Blocks an claim table covers: the larger of a pool's layer kinds.
uint32_t claim_table_blocks(const InstanceConfig& config);
const char* region_kind_name(uint32_t kind);

// Checks the preamble of a mapped segment: size, magic (published or not),
// layout version, layout hash, kind and recorded size, naming what mismatched.
// With `allow_unpublished`, a zero magic passes (and nothing more is checked).
Status validate_preamble(const std::byte* data, size_t size, const std::string& name,
                         SegmentKind kind, bool allow_unpublished);

// Fills in everything but the magic; the creator stores the magic last.
void write_preamble(SegmentPreamble& p, SegmentKind kind, uint64_t segment_bytes);

struct RegionEntry {
  uint32_t kind;   // RegionKind
  uint32_t index;  // rank for per-rank regions, else 0
  uint64_t offset;
  uint64_t bytes;
};
static_assert(sizeof(RegionEntry) == 24);

struct SegmentHeader {
  SegmentPreamble preamble;
  std::atomic<uint64_t> epoch;  // grows by one on every coordinator start
  std::atomic<uint32_t> state;  // InstanceState
  uint32_t region_count;
  InstanceConfig config;
  RegionEntry regions[kMaxRegions];
};
static_assert(std::is_standard_layout_v<SegmentHeader>);
static_assert(offsetof(SegmentHeader, epoch) == 96);
static_assert(offsetof(SegmentHeader, config) == 112);
static_assert(sizeof(SegmentHeader) == 112 + sizeof(InstanceConfig) + kMaxRegions * 24);

// A hash of every shared structure's size and field offsets. Two builds that
// agree on it lay out shared memory identically; any edit to a shared struct
// changes it, and attach refuses with "layout mismatch" instead of misreading.
consteval uint64_t compute_layout_hash() {
  const uint64_t facts[] = {
      kLayoutVersion,
      sizeof(SegmentPreamble),
      sizeof(SegmentHeader),
      offsetof(SegmentHeader, regions),
      sizeof(InstanceConfig),
      offsetof(InstanceConfig, role),
      offsetof(InstanceConfig, num_layers),
      offsetof(InstanceConfig, submit_ring_bytes),
      offsetof(InstanceConfig, request_deadline_ms),
      sizeof(RegionEntry),
      kMaxRegions,
      kRegionAlignment,
      sizeof(SpscRingHeader),
      offsetof(SpscRingHeader, slot_bytes),
      offsetof(SpscRingHeader, write_index),
      offsetof(SpscRingHeader, read_index),
      offsetof(SpscRingHeader, not_empty),
      sizeof(MpscRingHeader),
      offsetof(MpscRingHeader, tail),
      offsetof(MpscRingHeader, head),
      offsetof(MpscRingHeader, full_events),
      offsetof(MpscRingHeader, not_empty),
      MpscRing::kRecordHeaderBytes,
      sizeof(WaitEvent),
      sizeof(BarrierState),
      kBarrierHistory,
      sizeof(MpscProducerSlot),
      kMpscProducerSlots,
      offsetof(MpscRingHeader, producers),
      offsetof(SpscRingHeader, producer_lock),
      sizeof(InstanceStatus),
      sizeof(SwapProgressSlot),
      sizeof(PoolSlot),
      sizeof(LivenessSlot),
      offsetof(LivenessSlot, heartbeat_ns),
      sizeof(CountersBlock),
      offsetof(CountersBlock, values),
      offsetof(CountersBlock, histograms),
      sizeof(Histogram),
      kMaxCounters,
      kMaxHistograms,
      kHistogramBuckets,
      kLabelBytes,
      sizeof(ClaimTableHeader),
      sizeof(ClaimEntry),
      sizeof(ClaimWriterSlot),
      kClaimEntries,
      kClaimWriters,
  };
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a over the facts' bytes
  for (uint64_t f : facts) {
    for (int i = 0; i < 8; ++i) {
      h ^= (f >> (8 * i)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  }
  return h;
}
inline constexpr uint64_t kLayoutHash = compute_layout_hash();

}  // namespace kvrelay
