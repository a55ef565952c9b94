// kvrelay-worker: one process per TP rank. Normally started by
// kvrelay-coordinator (supervisor mode); start it yourself for an instance
// whose coordinator runs with --external-workers.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "shm/cpu_affinity.h"
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
  std::string protection = "authenticate";
  app.add_option("--net-protection", protection,
                 "network sessions: authenticate (every byte carries an AES-GCM tag) or encrypt "
                 "(and encrypted); both sides must agree (the coordinator's flag)")
      ->check(CLI::IsMember({"authenticate", "encrypt"}))
      ->capture_default_str();
  std::string rdma_devices;
  app.add_option("--rdma-devices", rdma_devices,
                 "rdma: RDMA device per rank, comma-separated (one for all ranks, or one per "
                 "rank; 'auto': the first)");
  app.add_option("--rdma-ib-port", o.network.rdma_port, "rdma: the device port")
      ->capture_default_str();
  app.add_option("--rdma-gid-index", o.network.rdma_gid_index, "rdma over RoCE: the GID index")
      ->capture_default_str();
  app.add_option("--rdma-traffic-class", o.network.rdma_traffic_class,
                 "rdma over RoCE: the traffic class")
      ->capture_default_str();
  app.add_option("--rdma-queue-pairs", o.network.rdma_queue_pairs,
                 "rdma: RC queue pairs per decode rank (1-16)")
      ->capture_default_str();
  app.add_option("--copy-max-sms", o.network.copy_max_sms,
                 "GPU pools: the most SMs a GPU-to-GPU copy's gather kernel takes (the "
                 "coordinator's flag)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--tcp-staging-mib", o.network.staging_slot_mib,
                 "GPU pools over tcp: MiB per staging slot, two per connection (the "
                 "coordinator's flag)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  std::string idle = "park", cpu_list;
  app.add_option("--idle-strategy", idle, "park, backoff or spin (the coordinator's flag)")
      ->check(CLI::IsMember({"park", "backoff", "spin"}))
      ->capture_default_str();
  app.add_option(
      "--cpu-list", cpu_list,
      "the instance's CPU list (the coordinator's flag): this rank takes entry rank + 1");
  CLI11_PARSE(app, argc, argv);
  for (size_t at = 0; !rdma_devices.empty() && at != std::string::npos;) {
    const size_t comma = rdma_devices.find(',', at);
    o.network.rdma_devices.push_back(rdma_devices.substr(at, comma - at));
    at = comma == std::string::npos ? comma : comma + 1;
  }
  o.attach_timeout = std::chrono::milliseconds(attach_ms);
  o.network.protection = protection == "encrypt" ? kvrelay::worker::net::Protection::kEncrypt
                                                 : kvrelay::worker::net::Protection::kAuthenticate;
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
