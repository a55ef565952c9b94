#include "instance/segment_header.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "shm/process_identity.h"

namespace kvrelay {

const char* instance_state_name(uint32_t state) {
  switch (static_cast<InstanceState>(state)) {
    case InstanceState::kInitialising: return "initialising";
    case InstanceState::kReady: return "ready";
    case InstanceState::kDraining: return "draining";
    case InstanceState::kDead: return "dead";
  }
  return "invalid";
}

uint32_t claim_table_blocks(const InstanceConfig& config) {
  return std::max(config.num_blocks, config.extra_layer_blocks);
}

const char* region_kind_name(uint32_t kind) {
  switch (static_cast<RegionKind>(kind)) {
    case RegionKind::kLiveness: return "liveness";
    case RegionKind::kCounters: return "counters";
    case RegionKind::kBarrier: return "barrier";
    case RegionKind::kSubmitRing: return "submit_ring";
    case RegionKind::kCompletionRing: return "completion_ring";
    case RegionKind::kTaskRing: return "task_ring";
    case RegionKind::kSignalRing: return "signal_ring";
    case RegionKind::kReportRing: return "report_ring";
    case RegionKind::kStatus: return "status";
    case RegionKind::kPoolDirectory: return "pool_directory";
    case RegionKind::kSwapProgress: return "swap_progress";
    case RegionKind::kClaimTable: return "claim_table";
    case RegionKind::kLandedRing: return "landed_ring";
    case RegionKind::kRequestStalls: return "request_stalls";
  }
  return "unknown";
}

Status validate_preamble(const std::byte* data, size_t size, const std::string& name,
                         SegmentKind kind, bool allow_unpublished) {
  if (size < sizeof(SegmentPreamble))
    return make_error(Errc::kSizeMismatch,
                      fmt::format("segment /{} is {} bytes, smaller than a kvrelay preamble ({} "
                                  "bytes): truncated or not a kvrelay segment",
                                  name, size, sizeof(SegmentPreamble)));
  const auto& p = *reinterpret_cast<const SegmentPreamble*>(data);
  const uint64_t magic = p.magic.load(std::memory_order_acquire);
  if (magic == 0) {
    if (allow_unpublished) return {};
    return make_error(Errc::kNotReady,
                      fmt::format("segment /{} is not published yet: its creator (pid {}) has not "
                                  "finished setting it up",
                                  name, p.creator_pid));
  }
  if (magic != kSegmentMagic)
    return make_error(Errc::kBadMagic,
                      fmt::format("segment /{} has magic 0x{:016x}, expected 0x{:016x}: not a "
                                  "kvrelay segment",
                                  name, magic, kSegmentMagic));
  if (p.layout_version != kLayoutVersion)
    return make_error(Errc::kVersionMismatch,
                      fmt::format("segment /{} has layout version {}, this build understands "
                                  "version {}: run one kvrelay version per instance",
                                  name, p.layout_version, kLayoutVersion));
  if (p.layout_hash != kLayoutHash)
    return make_error(Errc::kLayoutMismatch,
                      fmt::format("segment /{} has layout hash 0x{:016x}, this build 0x{:016x}: it "
                                  "was written by a differently built kvrelay",
                                  name, p.layout_hash, kLayoutHash));
  if (p.kind != static_cast<uint32_t>(kind))
    return make_error(Errc::kLayoutMismatch,
                      fmt::format("segment /{} is of kind {}, expected kind {}", name, p.kind,
                                  static_cast<uint32_t>(kind)));
  if (p.segment_bytes != size)
    return make_error(
        Errc::kSizeMismatch,
        fmt::format("segment /{} is {} bytes but its header says {}", name, size, p.segment_bytes));
  return {};
}

void write_preamble(SegmentPreamble& p, SegmentKind kind, uint64_t segment_bytes) {
  // Identity first, so that a crash from here on leaves a segment whose
  // creator can be judged dead.
  const ProcessIdentity me = self_identity();
  p.creator_pid = me.pid;
  p.creator_start_time = me.start_time;
  std::memcpy(p.reserved, &me.pid_ns, sizeof(me.pid_ns));  // creator_pid_ns
  p.creator_uid = static_cast<uint32_t>(geteuid());
  std::memcpy(p.boot_id, boot_id().data(), std::min(boot_id().size(), sizeof(p.boot_id) - 1));
  p.layout_version = kLayoutVersion;
  p.kind = static_cast<uint32_t>(kind);
  p.layout_hash = kLayoutHash;
  p.segment_bytes = segment_bytes;
}

}  // namespace kvrelay
