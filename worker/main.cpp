// kvrelay-worker: one process per TP rank. Normally started by
// kvrelay-coordinator (supervisor mode); start it yourself for an instance
// whose coordinator runs with --external-workers.
#include <CLI/CLI.hpp>

#include "worker/worker.h"

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
  app.add_option("--listen-address", o.network.listen_address,
                 "address the rank's tcp listener binds (decode role, --tcp-ports)")
      ->capture_default_str();
  app.add_option("--auth-key-file", o.network.auth_key_file,
                 "pre-shared key for tcp transfers: a 0600 file of >= 16 random bytes");
  app.add_option("--tcp-lanes", o.network.lanes, "parallel tcp connections per decode rank (1-8)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  o.attach_timeout = std::chrono::milliseconds(attach_ms);
  return kvrelay::worker::run_worker(o);
}
