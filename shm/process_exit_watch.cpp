#include "shm/process_exit_watch.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace kvrelay {

Result<ProcessExitWatch> ProcessExitWatch::start(uint32_t pid) {
  ProcessExitWatch w;
  if (pid == 0) return make_error(Errc::kInvalidArgument, "pid 0 is no process");
  const long fd = syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0);
  const int err = errno;
  if (fd < 0 && err == ESRCH)
    return make_error(Errc::kNotFound, fmt::format("no process runs as pid {}", pid));
  // Taken after the pidfd, so that a process that exits in between is
  // found exited by the first look rather than watched as another's pid.
  w.identity_ = identity_of(pid);
  if (fd >= 0) {
    w.pidfd_.reset(static_cast<int>(fd));
  } else {
    if (w.identity_.start_time == 0)
      return make_error(Errc::kNotFound, fmt::format("no process runs as pid {}", pid));
    w.polling_reason_ = system_error(fmt::format("pidfd_open({})", pid), err).message;
  }
  return w;
}

bool ProcessExitWatch::exited() const {
  if (!watching()) return false;
  if (pidfd_.valid()) {
    pollfd p{pidfd_.get(), POLLIN, 0};
    return poll(&p, 1, 0) > 0;
  }
  // Gone, a zombie, or its pid held by a later process.
  return check_liveness(identity_, "") != Liveness::kAlive;
}

}  // namespace kvrelay
