// One worker process per TP rank: attaches to the instance, registers in its
// liveness slot, maps (or creates) its pools, lines up with the other ranks
// on the start-up barrier, then serves: WorkerTasks from its task ring, layer
// signals from its signal ring, reports to its report ring. It exits cleanly,
// with a log line, when the coordinator dies or the instance shuts down.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "shm/wait_event.h"
#include "worker/transports.h"

namespace kvrelay::worker {

struct WorkerOptions {
  std::string instance;
  uint32_t rank = 0;
  std::string log_dir;
  std::string log_level = "info";
  // How long to keep trying to attach while the coordinator starts.
  std::chrono::milliseconds attach_timeout{30'000};
  NetworkOptions network;  // tcp: listen address, key file, lanes
  IdleStrategy idle = IdleStrategy::kPark;  // --idle-strategy
  std::vector<int> cpus;                    // --cpu-list: this rank takes entry rank + 1
};

// Runs the worker; returns the process exit code (0 on a clean exit).
int run_worker(const WorkerOptions& options);

}  // namespace kvrelay::worker
