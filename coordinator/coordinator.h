// kvrelay-coordinator: owns an instance's control segment, supervises its
// workers, runs the task table, and turns the workers' reports into exactly
// one completion per request. One thread, one loop:
//
//   drain the submit ring -> task table -> task rings (per rank)
//   drain the report rings -> task table -> completion ring
//   deadlines, supervision (pidfd exits, restarts, ready flags), heartbeat
//   park on the coordinator doorbell until something arrives or a timer is due
#pragma once

#include "coordinator/options.h"

namespace kvrelay::coordinator {

// Runs the coordinator until SIGTERM/SIGINT and a clean drain; returns the
// process exit code.
int run_coordinator(const CoordinatorOptions& options);

}  // namespace kvrelay::coordinator
