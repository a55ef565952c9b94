// The control segment of an instance: creation (replacing a stale one),
// attachment with full validation, and typed access to its regions.
//
//   create():  the coordinator. Exclusive. It takes the segment's owner lock
//              (owner_lock.h, on the preamble's first byte) before anything
//              else and holds it for its lifetime. If a segment of that name
//              exists, its owner lock decides: held means a live coordinator
//              serves it (refused, whatever its header says: a same-uid
//              process can zero the recorded pid, it cannot hold the lock);
//              free means its coordinator is gone, and the old segment is
//              unlinked and replaced, its epoch continued.
//   attach():  workers, clients, tools. Validates owner uid, size, magic,
//              layout version, layout hash, configuration and region
//              directory, in that order, before trusting anything, and says
//              exactly what mismatched.
//
// Shared memory is input from other processes, so the configuration and the
// region directory are copied once, at attach, and only the validated copy is
// used afterwards: a process that scribbles on the header later cannot send
// anybody outside the mapping. Only atomics (state, epoch, rings, slots) are
// read live.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "instance/control_layout.h"
#include "instance/segment_header.h"
#include "shm/owner_lock.h"
#include "shm/segment.h"

namespace kvrelay {

// What create() found and removed, for the coordinator's log.
struct StaleReplacement {
  uint32_t creator_pid = 0;
  std::string reason;  // "creator pid 123 is gone", ...
  uint64_t old_epoch = 0;
};

struct AttachOptions {
  SegmentAccess access = SegmentAccess::kReadWrite;
  // Attach even if the creator is dead (kvrelay-dump inspects dead instances).
  bool allow_stale = false;
  // Attach before the creator has published the segment (still refused if it
  // is not a kvrelay segment at all).
  bool allow_unpublished = false;
};

class ControlSegment {
 public:
  static Result<ControlSegment> create(const InstanceConfig& config,
                                       const SegmentOptions& options = {});
  static Result<ControlSegment> attach(std::string_view instance,
                                       const AttachOptions& options = {});
  // attach(), tried again every 20 ms until `until` while the instance's
  // coordinator is still starting (no segment yet, or one not yet
  // published), and, with `wait_out_stale`, while the segment is a dead
  // coordinator's (a worker started before its restarted coordinator). Any
  // other error is returned at once.
  static Result<ControlSegment> attach_when_published(std::string_view instance, Deadline until,
                                                      bool wait_out_stale = false);

  ControlSegment(ControlSegment&&) noexcept = default;
  ControlSegment& operator=(ControlSegment&&) noexcept = default;

  const std::optional<StaleReplacement>& replaced() const { return replaced_; }
  const SharedSegment& segment() const { return segment_; }
  // The shared header. Read its atomics (state, epoch) live; everything else
  // through the validated copies below.
  SegmentHeader& header() const { return *reinterpret_cast<SegmentHeader*>(segment_.data()); }
  const InstanceConfig& config() const { return config_; }
  std::string instance() const { return instance_of(config_); }
  uint64_t epoch() const { return header().epoch.load(std::memory_order_acquire); }
  InstanceState state() const;
  // Stores the state and wakes everyone waiting on status().state_changed.
  void set_state(InstanceState s) const;

  // The bytes of region (kind, index), from the validated directory; empty
  // when it has none.
  std::span<std::byte> region(RegionKind kind, uint32_t index = 0) const;

  // ---- owner locks (owner_lock.h) ----
  // The lock space of the segment's file; offsets are byte offsets in it.
  LockSpace locks() const { return LockSpace{segment_.fd(), 0}; }
  // The lock of a structure in the segment: its first byte.
  LockSpace lock_of(const void* in_segment) const;
  // Whether the coordinator that created the segment still holds it.
  LockState coordinator_liveness() const { return locks().probe(0); }
  // A worker's claim on its rank, held for its life: false when another live
  // process serves the rank.
  [[nodiscard]] bool lock_rank(uint32_t rank) const;
  LockState rank_liveness(uint32_t rank) const;

  LivenessSlot& coordinator_slot() const { return liveness()[0]; }
  LivenessSlot& worker_slot(uint32_t rank) const { return liveness()[1 + rank]; }
  CountersBlock& counters(uint32_t block) const;
  BarrierState& barrier() const;
  InstanceStatus& status() const;
  PoolDirectory& pool_directory() const;
  SwapProgressTable& swap_progress() const;
  StallBoard& request_stalls() const;

  // Rings, attached with their owner locks.
  Result<MpscRing> submit_ring() const { return mpsc(RegionKind::kSubmitRing, 0); }
  Result<MpscRing> completion_ring() const { return mpsc(RegionKind::kCompletionRing, 0); }
  Result<MpscRing> task_ring(uint32_t rank) const { return mpsc(RegionKind::kTaskRing, rank); }
  // Decode role only: what ipc writers into rank's pool say landed, and
  // the claims they check first (claim_table.h). Empty / kNotFound otherwise.
  Result<MpscRing> landed_ring(uint32_t rank) const { return mpsc(RegionKind::kLandedRing, rank); }
  std::span<std::byte> claim_table(uint32_t rank) const {
    return region(RegionKind::kClaimTable, rank);
  }
  template <class T>
  Result<SpscRing<T>> signal_ring(uint32_t rank) const {
    auto r = region(RegionKind::kSignalRing, rank);
    return SpscRing<T>::attach(r.data(), r.size(), lock_of(r.data()));
  }
  template <class T>
  Result<SpscRing<T>> report_ring(uint32_t rank) const {
    auto r = region(RegionKind::kReportRing, rank);
    return SpscRing<T>::attach(r.data(), r.size(), lock_of(r.data()));
  }

  // Removes the segment's name if it still refers to this segment (and not
  // to a successor that replaced it). The creator calls it on shutdown.
  Status unlink() const;

 private:
  explicit ControlSegment(SharedSegment seg) : segment_(std::move(seg)) {}
  void adopt(const InstanceConfig& config);
  LivenessSlot* liveness() const;
  Result<MpscRing> mpsc(RegionKind kind, uint32_t index) const;
  Status initialize(const InstanceConfig& config, const ControlLayout& layout, uint64_t epoch);

  SharedSegment segment_;
  InstanceConfig config_{};
  std::vector<RegionEntry> regions_;
  std::optional<StaleReplacement> replaced_;
};

// Checks a mapped segment's preamble and header (everything attach checks
// except ownership, which the mapping already enforced). Exposed for tools
// that map a segment themselves.
Status validate_control_header(const std::byte* data, size_t size, const std::string& name,
                               bool allow_unpublished);

// Whether the creator recorded in a preamble still runs, judged by its owner
// lock (`owner_lock`: the segment's file at offset 0); for decisions and
// messages.
struct CreatorStatus {
  LockState lock = LockState::kUnknown;
  Liveness liveness = Liveness::kGone;  // what /proc says of the recorded pid
  uint32_t pid = 0;
  bool alive() const {
    return lock == LockState::kHeld ||
           (lock == LockState::kUnknown &&
            (liveness == Liveness::kAlive || liveness == Liveness::kUnverifiable));
  }
  std::string describe() const;  // "coordinator pid 123 is gone"
};
CreatorStatus creator_status(const SegmentPreamble& preamble, LockSpace owner_lock);

}  // namespace kvrelay
