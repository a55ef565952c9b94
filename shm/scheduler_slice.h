// The scheduler's time slice of a process, as a latency hint.
//
// Linux's fair scheduler (EEVDF, 6.6+) gives each task a virtual deadline of
// its eligible time plus its slice; since 6.12 a task may ask for its own
// slice (sched_setattr's sched_runtime, 0.1-100 ms, no privilege needed), and
// a waking task with a shorter slice than the running one preempts it.
// The slice changes when a task runs, not how much CPU it gets: its weight
// (nice) stays what it was.
//
// kvrelay's coordinator wants exactly that: it wakes for a report or a
// request, works for microseconds, and parks again, while the workers (and
// the engine) copy and compute for hundreds. With the kernel's default
// slice, a coordinator woken by a rank's finished report waited for a core
// behind them: it read the report 130-180 us after it was written on 2
// cores, where the wake-up itself is 20-30 us (docs/latency.md).
#pragma once

#include <sys/types.h>

#include "shm/clock.h"
#include "shm/result.h"

namespace kvrelay {

// The coordinator's default (kvrelay-coordinator --wake-slice-us).
inline constexpr Nanos kCoordinatorSlice = std::chrono::microseconds(100);

// Asks for `slice` as the calling thread's scheduler slice; zero asks for the
// kernel's default. Threads and processes it starts afterwards inherit it.
// The policy and nice value are kept. Returns the slice the kernel reports
// afterwards: zero where it keeps no slice per task (before Linux 6.12 the
// hint is accepted and has no effect). kUnsupported, changing nothing, for a
// thread outside the fair class (SCHED_FIFO, SCHED_RR, SCHED_DEADLINE,
// SCHED_IDLE: an operator's choice that a hint must not undo).
Result<Nanos> set_scheduler_slice(Nanos slice);

// A thread's slice as the kernel reports it (zero: no per-task slice on
// this kernel, or a policy outside the fair class). `thread` 0: the calling
// thread; a process's pid names its main thread.
Result<Nanos> scheduler_slice(pid_t thread = 0);

}  // namespace kvrelay
