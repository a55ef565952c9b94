// A seccomp filter that makes chosen system calls fail, as a container's
// profile or an older kernel does (Docker's old default answered calls it
// did not list with EPERM; a kernel that lacks a call answers ENOSYS). Tests
// use it to check that kvrelay falls back, or says what is missing, rather
// than failing in a way nobody can act on.
#pragma once

#include <string>
#include <vector>

#include "shm/result.h"

namespace kvrelay::testing {

// The system calls a filter may refuse, by name (pidfd_open, membarrier,
// sched_setattr, sched_getattr, waitid, ...): kInvalidArgument for another.
Result<std::vector<long>> syscall_numbers(const std::vector<std::string>& names);

// From now on, every thread of this process, and every process it starts,
// gets `error` (EPERM, ENOSYS, ...) from the calls `numbers`; all other
// calls go through. It cannot be undone: call it in a child.
Status refuse_syscalls(const std::vector<long>& numbers, int error);

}  // namespace kvrelay::testing
