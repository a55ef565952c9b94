#include "instance/control_layout.h"

#include "shm/bits.h"

namespace kvrelay {

namespace {

class Planner {
 public:
  Planner() : cursor_(align_up(sizeof(SegmentHeader), kRegionAlignment)) {}
  void add(RegionKind kind, uint32_t index, uint64_t bytes) {
    layout_.regions.push_back(RegionEntry{static_cast<uint32_t>(kind), index, cursor_, bytes});
    cursor_ = align_up(cursor_ + bytes, kRegionAlignment);
  }
  ControlLayout finish() {
    layout_.total_bytes = cursor_;
    return std::move(layout_);
  }

 private:
  ControlLayout layout_;
  uint64_t cursor_;
};

}  // namespace

// Nine regions of the instance, three of each rank, two more of each decode rank.
static_assert(9 + 5 * kMaxTpSize <= kMaxRegions);

ControlLayout plan_control_layout(const InstanceConfig& c) {
  Planner p;
  p.add(RegionKind::kLiveness, 0, sizeof(LivenessSlot) * (1 + uint64_t{c.tp_size}));
  p.add(RegionKind::kCounters, 0, sizeof(CountersBlock) * (2 + uint64_t{c.tp_size}));
  p.add(RegionKind::kBarrier, 0, sizeof(BarrierState));
  p.add(RegionKind::kStatus, 0, sizeof(InstanceStatus));
  p.add(RegionKind::kPoolDirectory, 0, sizeof(PoolDirectory));
  p.add(RegionKind::kSwapProgress, 0, sizeof(SwapProgressTable));
  p.add(RegionKind::kRequestStalls, 0, sizeof(StallBoard));
  p.add(RegionKind::kSubmitRing, 0, MpscRing::bytes_for(c.submit_ring_bytes));
  p.add(RegionKind::kCompletionRing, 0, MpscRing::bytes_for(c.completion_ring_bytes));
  for (uint32_t r = 0; r < c.tp_size; ++r) {
    p.add(RegionKind::kTaskRing, r, MpscRing::bytes_for(c.task_ring_bytes));
    p.add(RegionKind::kSignalRing, r,
          spsc_region_bytes(c.signal_ring_records, c.signal_record_bytes));
    p.add(RegionKind::kReportRing, r,
          spsc_region_bytes(c.report_ring_records, c.report_record_bytes));
  }
  if (c.role == static_cast<uint32_t>(Role::kDecode)) {
    for (uint32_t r = 0; r < c.tp_size; ++r) {
      p.add(RegionKind::kClaimTable, r, claim_table_bytes(claim_table_blocks(c)));
      p.add(RegionKind::kLandedRing, r, MpscRing::bytes_for(kLandedRingBytes));
    }
  }
  return p.finish();
}

}  // namespace kvrelay
