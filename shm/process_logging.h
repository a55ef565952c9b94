// Logging for every kvrelay process (DESIGN.md section 8): spdlog to one file
// per process (<log_dir>/kvrelay-<process>.log) and to the console, at a level
// chosen by flag. Process-wide plumbing, like liveness and identity.
#pragma once

#include <string>

#include "shm/result.h"

namespace kvrelay {

// `process` is e.g. "coordinator" or "worker-rank1". `level` is one of
// trace, debug, info, warn, error, critical, off. An empty log_dir logs to
// the console only. Every line names `instance` (when given). Log files
// rotate at kLogFileBytes, keeping kLogFiles old files beside the current one.
inline constexpr size_t kLogFileBytes = size_t{64} << 20;
inline constexpr size_t kLogFiles = 3;
Status setup_logging(const std::string& process, const std::string& log_dir,
                     const std::string& level, const std::string& instance = {});

}  // namespace kvrelay
