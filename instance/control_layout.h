// Where each region of a control segment goes, computed from the instance
// configuration alone. The creator lays the segment out with it; an attacher
// recomputes it and compares with the region directory in the header, so a
// directory that disagrees with the configuration is caught before use.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "instance/segment_header.h"

namespace kvrelay {

// Counters blocks in a control segment: coordinator, shared client block, then one per rank.
inline constexpr uint32_t kCoordinatorCounters = 0;
inline constexpr uint32_t kClientCounters = 1;
inline constexpr uint32_t worker_counters_index(uint32_t rank) {
  return 2 + rank;
}

// The clients' block is shared by every client of the instance: the
// coordinator defines its labels, clients record with record_shared.
enum ClientHistogram : uint32_t {
  kCompletionWrittenToEngineReadNs,  // the coordinator wrote a completion -> an engine read it
};
inline constexpr std::pair<const char*, const char*> kClientHistogramLabels[] = {
    {"hop_completion_to_engine_read", "ns"},
};
inline constexpr const char* kClientHistogramHelp[] = {
    "Completion hop: the coordinator wrote a completion -> an engine's client read it",
};

struct ControlLayout {
  std::vector<RegionEntry> regions;
  uint64_t total_bytes = 0;
};

// Requires a config that passed validate_config().
ControlLayout plan_control_layout(const InstanceConfig& config);

}  // namespace kvrelay
