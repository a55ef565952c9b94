// Why a rank's worker is down, kept in the instance for whoever looks
// (kvrelay-dump, the coordinator's log): the worker writes why it gives up
// just before it exits with an error; its supervising coordinator reads that,
// and writes back how the worker ended with whether it will be restarted
// ("restarting after: ..." or "not restarted: ..."); a new worker's start
// clears it.
// NUL-terminated, at most kExitReasonBytes - 1 bytes; only printable ASCII is
// read back (it comes from another process).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "instance/instance_status.h"

namespace kvrelay {

void write_exit_reason(InstanceStatus& status, uint32_t rank, std::string_view why);
std::string read_exit_reason(const InstanceStatus& status, uint32_t rank);
void clear_exit_reason(InstanceStatus& status, uint32_t rank);

}  // namespace kvrelay
