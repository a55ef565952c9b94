// The control segment of an instance: creation (replacing a stale one),
// attachment with full validation, and typed access to its regions.
//
//   create():  the coordinator. Exclusive; if a segment of that name exists
//              and its creator is alive, refuses; if the creator is dead (pid
//              gone, or pid reused by another process, or another boot), the
//              old segment is unlinked and replaced, and the epoch continues
//              from the old one.
//   attach():  workers, clients, tools. Validates owner uid, size, magic,
//              layout version, layout hash, configuration and region
//              directory, in that order, before trusting anything, and says
//              exactly what mismatched.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "shm/control_layout.h"
#include "shm/segment.h"
#include "shm/segment_header.h"

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

  ControlSegment(ControlSegment&&) noexcept = default;
  ControlSegment& operator=(ControlSegment&&) noexcept = default;

  const std::optional<StaleReplacement>& replaced() const { return replaced_; }
  const SharedSegment& segment() const { return segment_; }
  SegmentHeader& header() const { return *reinterpret_cast<SegmentHeader*>(segment_.data()); }
  const InstanceConfig& config() const { return header().config; }
  std::string instance() const { return instance_of(config()); }
  uint64_t epoch() const { return header().epoch.load(std::memory_order_acquire); }
  InstanceState state() const;
  // Stores the state and wakes everyone waiting on status().state_changed.
  void set_state(InstanceState s) const;

  // The bytes of region (kind, index); empty when the directory has none.
  std::span<std::byte> region(RegionKind kind, uint32_t index = 0) const;

  LivenessSlot& coordinator_slot() const { return liveness()[0]; }
  LivenessSlot& worker_slot(uint32_t rank) const { return liveness()[1 + rank]; }
  CountersBlock& counters(uint32_t block) const;
  BarrierState& barrier() const;
  InstanceStatus& status() const;
  PoolDirectory& pool_directory() const;
  SwapProgressTable& swap_progress() const;

  Result<MpscRing> submit_ring() const { return mpsc(RegionKind::kSubmitRing, 0); }
  Result<MpscRing> completion_ring() const { return mpsc(RegionKind::kCompletionRing, 0); }
  Result<MpscRing> task_ring(uint32_t rank) const { return mpsc(RegionKind::kTaskRing, rank); }
  template <class T>
  Result<SpscRing<T>> signal_ring(uint32_t rank) const {
    auto r = region(RegionKind::kSignalRing, rank);
    return SpscRing<T>::attach(r.data(), r.size());
  }
  template <class T>
  Result<SpscRing<T>> report_ring(uint32_t rank) const {
    auto r = region(RegionKind::kReportRing, rank);
    return SpscRing<T>::attach(r.data(), r.size());
  }

  // Removes the segment's name if it still refers to this segment (and not
  // to a successor that replaced it). The creator calls it on shutdown.
  Status unlink() const;

 private:
  explicit ControlSegment(SharedSegment seg) : segment_(std::move(seg)) {}
  LivenessSlot* liveness() const;
  Result<MpscRing> mpsc(RegionKind kind, uint32_t index) const;
  Status initialize(const InstanceConfig& config, const ControlLayout& layout, uint64_t epoch);

  SharedSegment segment_;
  std::optional<StaleReplacement> replaced_;
};

// Checks a mapped segment's preamble and header (everything attach checks
// except ownership, which the mapping already enforced). Exposed for tools
// that map a segment themselves.
Status validate_control_header(const std::byte* data, size_t size, const std::string& name,
                               bool allow_unpublished);

// Whether the creator recorded in a preamble still runs; for messages.
struct CreatorStatus {
  Liveness liveness = Liveness::kGone;
  uint32_t pid = 0;
  std::string describe() const;  // "coordinator pid 123 is gone"
};
CreatorStatus creator_status(const SegmentPreamble& preamble);

}  // namespace kvrelay
