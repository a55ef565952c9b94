// kvrelay-worker: one process per TP rank. Normally started by
// kvrelay-coordinator (supervisor mode); start it yourself for an instance
// whose coordinator runs with --external-workers.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "shm/cpu_affinity.h"
#include "worker/transport_options.h"
#include "worker/worker.h"
#include "shm/command_line.h"

int main(int argc, char** argv) {
  kvrelay::worker::WorkerOptions o;
  CLI::App app{"kvrelay-worker: runs the block copies of one tensor-parallel rank"};
  app.add_option("--instance", o.instance, "instance name (the coordinator's --instance)")
      ->required();
  app.add_option("--rank", o.rank,
                 "tensor-parallel rank this worker serves (the original's --rank)")
      ->required();
  app.add_option("--log-dir", o.log_dir,
                 "directory for kvrelay-worker-rank<r>.log (empty: console only)");
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error, critical or off")
      ->capture_default_str();
  int64_t attach_ms = o.attach_timeout.count();
  app.add_option("--attach-timeout-ms", attach_ms, "how long to wait for the coordinator's segment")
      ->capture_default_str();
  // The data plane's and the network transports' flags, declared by their
  // owners for both programs (the coordinator hands on its own).
  kvrelay::worker::declare_transport_options(app, o.network);
  std::string idle = "park", cpu_list;
  app.add_option("--idle-strategy", idle, "park, backoff or spin (the coordinator's flag)")
      ->check(CLI::IsMember({"park", "backoff", "spin"}))
      ->capture_default_str();
  app.add_option(
      "--cpu-list", cpu_list,
      "the instance's CPU list (the coordinator's flag): this rank takes entry rank + 1");
  kvrelay::add_version_flag(app, "kvrelay-worker");
  KVRELAY_PARSE_COMMAND_LINE(app, argc, argv);
  o.attach_timeout = std::chrono::milliseconds(attach_ms);
  if (!cpu_list.empty()) {
    kvrelay::Result<std::vector<int>> cpus = kvrelay::parse_cpu_list(cpu_list);
    if (!cpus) {
      fmt::print(stderr, "kvrelay-worker: {}\n", cpus.error().message);
      return 2;
    }
    o.cpus = std::move(cpus).value();
  }
  kvrelay::parse_idle_strategy(idle, o.idle);  // checked by CLI above
  return kvrelay::worker::run_worker(o);
}
