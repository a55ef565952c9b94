// Starts a program as a child process: the one launcher the coordinator (its
// workers), the simulator (its instances) and the tests use.
//
// With `die_with_parent`, the child gets `parent_death_signal` when the
// process that started it dies, however it dies (PR_SET_PDEATHSIG), so that
// killing a supervisor never orphans what it started. The signal is tied to
// the thread that called spawn_process: call it from a thread that lives as
// long as the children should (the main thread).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "shm/result.h"

namespace kvrelay {

struct SpawnOptions {
  bool die_with_parent = false;
  int parent_death_signal = SIGTERM;
  // "NAME=value" entries added to (or replacing those of) this environment.
  std::vector<std::string> environment;
  // When >= 0: the child's stdout and stderr go to this descriptor.
  int output_fd = -1;
  // The child leads a process group of its own: a signal sent to the
  // parent's group (Ctrl-C in a terminal, `kill -INT -PGID`, `timeout`)
  // does not reach it, and the parent decides how it stops.
  bool own_process_group = false;
};

// argv[0] is the program's path. The pid, or why it could not start.
Result<pid_t> spawn_process(const std::vector<std::string>& argv, const SpawnOptions& options = {});

}  // namespace kvrelay
