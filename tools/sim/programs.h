// Helper programs the tools start (ip, iperf3): found on PATH, since
// spawn_process uses execve, which does not search it, and run to their end
// with their output kept for the error a user reads.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "shm/result.h"

namespace kvrelay::sim {

// The program's path on PATH or in the sbin directories that a non-login
// root shell may lack; nullopt when none is executable.
std::optional<std::string> find_program(const std::string& name);

struct ProgramRun {
  int exit_code = 0;   // 128 + the signal when one ended it
  std::string output;  // stdout and stderr together
};

// Runs argv (argv[0] a path) to its end.
Result<ProgramRun> run_program(const std::vector<std::string>& argv);

// A child of this process (spawn_process): reaps it if it has exited.
bool reap_if_exited(pid_t pid);
// Gives a child (a benchmark's server, which ends with its one client)
// `grace` to exit, then SIGTERMs it, and reaps it either way. Never signals
// a child already reaped: its pid may be another process's by then.
void end_child(pid_t pid, std::chrono::milliseconds grace);

}  // namespace kvrelay::sim
