// Logging for every kvrelay process (DESIGN.md section 8): spdlog to one file
// per process (<log_dir>/kvrelay-<process>.log) and to the console, at a level
// chosen by flag. Process-wide plumbing, like liveness and identity.
#pragma once

#include <string>

#include "shm/result.h"

namespace kvrelay {

// `process` is e.g. "coordinator" or "worker-rank1". `level` is one of
// trace, debug, info, warn, error, critical, off. An empty log_dir logs to
// the console only.
Status setup_logging(const std::string& process, const std::string& log_dir,
                     const std::string& level);

}  // namespace kvrelay
