// kvrelay-coordinator's command line. The original cache messager's flags
// appear under clear names (docs/operating.md has the mapping table); the result is
// an InstanceConfig plus how to run the processes.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "instance/instance_config.h"
#include "shm/result.h"
#include "shm/scheduler_slice.h"
#include "shm/wait_event.h"

namespace kvrelay::coordinator {

struct CoordinatorOptions {
  InstanceConfig config{};
  bool external_workers = false;  // wait for workers started by another supervisor
  std::string worker_binary;      // default: kvrelay-worker next to this executable
  std::string log_dir;            // empty: console only
  std::string log_level = "info";
  bool group_access = false;  // segments 0660 instead of 0600
  std::chrono::milliseconds startup_timeout{60'000};
  std::chrono::milliseconds drain_timeout{10'000};
  // Passed to every worker this coordinator starts: the data plane's and
  // the network transports' flags (worker/transport_options.h), and
  // --idle-strategy and --cpu-list.
  std::vector<std::string> worker_args;
  // --idle-strategy and --cpu-list (also passed to every worker it starts).
  IdleStrategy idle = IdleStrategy::kPark;
  std::vector<int> cpus;
  // --wake-slice-us: the coordinator's scheduler slice (shm/scheduler_slice.h);
  // zero leaves the kernel's default.
  Nanos wake_slice = kCoordinatorSlice;
};

// Parses argv. On --help or a bad flag, returns an error whose message is
// what to print, with code kInvalidArgument (bad input) or kOk-like kNotFound
// for --help (print and exit 0).
Result<CoordinatorOptions> parse_options(int argc, char** argv);

// Bytes one rank's pools (device + host tier) need, for the "does it fit" check.
uint64_t pool_bytes_per_rank(const InstanceConfig& config);

}  // namespace kvrelay::coordinator
