// Pinning a process to a CPU (--cpu-list): with the spin idle strategy each
// kvrelay process wants a core of its own, and one the scheduler does not
// move it off.
#pragma once

#include <string_view>
#include <vector>

#include "shm/result.h"
#include "shm/wait_event.h"

namespace kvrelay {

// Parses a Linux CPU list, e.g. "2-5,8": CPUs in the order written, no CPU
// twice, each below CPU_SETSIZE. An error names what is wrong.
Result<std::vector<int>> parse_cpu_list(std::string_view text);

// Pins the calling process (all its threads created afterwards too) to `cpu`.
Status pin_to_cpu(int cpu);

// Where one of an instance's processes runs and how it idles: the
// coordinator is process 0, rank r's worker process r + 1; process i takes
// cpus[i % size] (none: unpinned). Sets the process's idle strategy.
Status place_process(IdleStrategy idle, const std::vector<int>& cpus, uint32_t process_index);

}  // namespace kvrelay
