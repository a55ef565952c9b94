// Watches one process that need not be our child (an engine that registered
// its memory with a worker) for its exit, so that its memory is let go of.
//
// Through a pidfd, readable once the process exits. Where pidfd_open is
// refused (a container's seccomp profile that predates it, a kernel before
// 5.3), by the process's start time in /proc, which also tells it from a
// later process that got its pid: each exited() then reads /proc once.
#pragma once

#include <cstdint>
#include <string>

#include "shm/process_identity.h"
#include "shm/result.h"
#include "shm/unique_fd.h"

namespace kvrelay {

class ProcessExitWatch {
 public:
  ProcessExitWatch() = default;  // watches nothing
  // kNotFound when no running process holds `pid` (it has exited, or it is
  // in another pid namespace).
  static Result<ProcessExitWatch> start(uint32_t pid);

  uint32_t pid() const { return identity_.pid; }
  bool watching() const { return identity_.pid != 0; }
  // Whether the watched process has exited (false while nothing is watched).
  // One system call, or one read of /proc where polled.
  bool exited() const;
  // Why the process is polled rather than watched through a pidfd; empty
  // when it is not.
  const std::string& polling_reason() const { return polling_reason_; }

 private:
  ProcessIdentity identity_;
  UniqueFd pidfd_;
  std::string polling_reason_;
};

}  // namespace kvrelay
