// Names of kvrelay's POSIX shared-memory segments (DESIGN.md section 3).
//
//   control segment:  /kvrelay-<instance>
//   host KV pools:    /kvrelay-<instance>-pool-r<rank>  (and -<tag>-r<rank>)
//
// Instance names are [A-Za-z0-9._-]{1,64}, may not start with "-" (it would
// read as a flag) or contain "..": they end up in file names under /dev/shm
// and on command lines, so anything else is refused.
#pragma once

#include <string>
#include <string_view>

#include "shm/result.h"

namespace kvrelay {

inline constexpr size_t kMaxInstanceNameBytes = 64;
inline constexpr std::string_view kSegmentPrefix = "kvrelay-";

Status validate_instance_name(std::string_view instance);

// Segment names, without the leading '/' (Boost.Interprocess adds it).
std::string control_segment_name(std::string_view instance);
std::string pool_segment_name(std::string_view instance, std::string_view tag, uint32_t rank);

}  // namespace kvrelay
