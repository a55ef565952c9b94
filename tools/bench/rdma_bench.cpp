// rdma transport bandwidth against rdma-core's perftest (ib_write_bw) on the
// same device, with the same message sizes, in one run: kvrelay sends every
// layer of scattered blocks (so each RDMA WRITE is one block of one tensor)
// from one pool to another through a real session (control connection,
// intents and grants, queue pairs, one WRITE_WITH_IMM per layer, the
// receiver's ack); ib_write_bw writes messages of the block's size between
// two processes over as many queue pairs. Runs where ibv_devices lists a device: on soft-RoCE inside
// tools/rxe-vm (where only the ratio means anything), or on a NIC
// (tools/rdma-check). Exits 77, saying why, where there is no device.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/cfg/env.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <thread>

#include "bench_pools.h"
#include "bench_support.h"
#include "instance/instance_config.h"
#include "instance/pool_segment.h"
#include "perftest_baseline.h"
#include "shm/command_line.h"
#include "worker/copy_plan.h"
#include "worker/net/timing.h"
#include "worker/rdma/fabric.h"
#include "worker/rdma/rdma_transport.h"
#include "worker/receiver.h"

using namespace kvrelay;
using namespace kvrelay::bench;
using namespace std::chrono_literals;

namespace {

// kvrelay: MB/s (10^6 bytes) moving `total` bytes as layers of scattered
// blocks, or why not. A failure returns through every destructor (the
// session, the net thread, the pools), so that the error path is exercised
// as a worker runs it, not cut short by exit().
Result<double> kvrelay_mbps(worker::rdma::Fabric& fabric, uint64_t block_bytes,
                            uint64_t layer_bytes, uint64_t total, uint32_t queue_pairs,
                            const worker::net::Timing& timing) {
  const PoolGeometry g = geometry_for(block_bytes, layer_bytes);
  const std::string tag = fmt::format("kvrelay-bench-rdma-{}", getpid());
  auto src = make_pool(tag + "-src", g);
  auto dst = make_pool(tag + "-dst", g);
  for (uint32_t l = 0; l < kLayers; ++l)
    std::memset(src->tensor(l, PoolTensor::kKey), static_cast<int>(l + 1), g.tensor_bytes(l, PoolTensor::kKey));
  const AuthKey key = AuthKey::from_bytes(std::vector<uint8_t>(32, 5));
  worker::net::NetThread net;
  worker::ReceiverOptions ro;
  ro.instance = "bench-d";
  ro.timing = timing;
  ro.rdma = std::make_shared<worker::rdma::RdmaListener>(&fabric, "", *dst, 0);
  auto receiver = worker::Receiver::start(net, *dst, key, ro);
  if (!receiver) {
    fmt::print(stderr, "{}\n", receiver.error().message);
    std::exit(1);
  }
  worker::rdma::RdmaSenderOptions so;
  so.instance = "bench-p";
  so.queue_pairs = queue_pairs;
  so.timing = timing;
  worker::rdma::RdmaTransport sender(net, *src, &key, &fabric, "", so, nullptr);
  const std::shared_ptr<worker::Destination> dest =
      loopback_destination(sender, schema::TransferProtocol::RDMA, (*receiver)->port(), "bench-d");
  // Scattered: a permutation, so no two blocks coalesce.
  std::vector<uint32_t> src_ids(g.num_blocks), dst_ids(g.num_blocks);
  std::iota(src_ids.begin(), src_ids.end(), 0);
  std::iota(dst_ids.begin(), dst_ids.end(), 0);
  std::mt19937 rng(1);
  std::shuffle(dst_ids.begin(), dst_ids.end(), rng);
  auto runs = worker::plan_block_runs(src_ids, dst_ids, g.num_blocks, g.num_blocks, 0, 0);
  if (!runs) return runs.error();
  const uint64_t per_layer = uint64_t{g.num_blocks} * 2 * block_bytes;
  const uint64_t layers = std::max<uint64_t>(kLayers, total / per_layer);

  auto send = [&](uint64_t n) -> Status {
    std::vector<worker::TransferCompletion> done;
    for (uint64_t i = 0; i < n; ++i) {
      worker::TransferTicket t;
      t.handle = i / kLayers + 1;
      t.layer = static_cast<uint32_t>(i % kLayers);
      (void)dest->submit_layer(t, t.layer, *runs);
    }
    // A stall is an error the bench names, before any outer deadline (the
    // emulated guest's) cuts it short: 1 MB/s is far below soft-RoCE's worst.
    const auto limit = std::chrono::seconds(std::max<uint64_t>(120, n * per_layer / 1000000));
    const auto until = std::chrono::steady_clock::now() + limit;
    while (done.size() < n && std::chrono::steady_clock::now() < until) {
      sender.poll(done);
      std::this_thread::sleep_for(100us);
    }
    for (const auto& c : done)
      if (!c.status)
        return make_error(c.status.code(),
                          fmt::format("a transfer failed: {}", c.status.error().message));
    if (done.size() < n)
      return make_error(Errc::kTimeout, fmt::format("{} of {} layers completed within {} s",
                                                    done.size(), n, limit.count()));
    return {};
  };
  // The first: the session, its queue pairs and registrations.
  if (Status s = send(kLayers); !s) return s.error();
  const auto t0 = std::chrono::steady_clock::now();
  if (Status s = send(layers); !s) return s.error();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(layers * per_layer) / s / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvrelay-bench-rdma: the rdma transport against ib_write_bw on one device"};
  std::string device;
  int gid_index = 1;
  uint64_t total_mib = 24;
  uint32_t queue_pairs = 2;
  std::vector<uint64_t> sizes_kib = {16, 256};
  app.add_option("--device", device, "RDMA device (default: the first)");
  app.add_option("--gid-index", gid_index, "RoCE GID index")->capture_default_str();
  app.add_option("--mib", total_mib, "MiB moved per case and side")->capture_default_str();
  app.add_option("--queue-pairs", queue_pairs, "kvrelay's queue pairs")->capture_default_str();
  app.add_option("--block-kib", sizes_kib, "block (message) sizes")->capture_default_str();
  InstanceConfig instance = default_config("bench", 1);
  app.add_option("--peer-timeout-ms", instance.peer_timeout_ms,
                 "the instances' peer timeout (--peer-timeout-ms): soft-RoCE in an emulated "
                 "guest copies in the guest's kernel, on the CPUs the heartbeats need")
      ->capture_default_str();
  kvrelay::add_version_flag(app, "kvrelay-bench-rdma");
  KVRELAY_PARSE_COMMAND_LINE(app, argc, argv);
  const worker::net::Timing timing = worker::net::timing_of(instance);
  spdlog::set_level(spdlog::level::warn);
  spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug: what the sessions say

  worker::rdma::FabricOptions fo;
  fo.device = device;
  fo.gid_index = gid_index;
  auto fabric = worker::rdma::open_verbs_fabric(fo);
  if (!fabric) {
    fmt::print("kvrelay-bench-rdma: skipped: {}\n", fabric.error().message);
    return 77;
  }
  const std::string name = (*fabric)->name();
  const std::string dev = name.substr(0, name.find(' '));
  print_header(fmt::format("rdma transfer bandwidth (MB/s) on {}, scattered blocks, {} queue pairs",
                           name, queue_pairs),
               "ib_write_bw");
  double worst = 1e9;
  std::vector<std::string> unmeasured;
  for (uint64_t kib : sizes_kib) {
    const uint64_t bytes = kib * 1024;
    const uint64_t total = total_mib << 20;
    Row row;
    row.name = fmt::format("{} KiB blocks", kib);
    row.unit = "MB/s";
    Result<double> ours = kvrelay_mbps(
        **fabric, bytes, std::min<uint64_t>(total / kLayers, 8ull << 20), total, queue_pairs,
        timing);
    if (!ours) {
      fmt::print(stderr, "{} KiB blocks: {}\n", kib, ours.error().message);
      return 1;
    }
    row.ours = *ours;
    const Result<double> baseline = run_ib_write_bw(
        {dev, gid_index, queue_pairs, bytes, std::max<uint64_t>(16, total / bytes)});
    if (baseline) row.baseline = *baseline;
    print_row(row);
    record_point("kvrelay", "block KiB", static_cast<double>(kib), "MB/s", row.ours, true);
    if (baseline) {
      record_point("ib_write_bw", "block KiB", static_cast<double>(kib), "MB/s", row.baseline,
                   true);
      worst = std::min(worst, row.ratio());
    } else {
      // No baseline, no verdict: the target below says which size lacks one.
      const std::string note =
          fmt::format("{} KiB blocks: no ib_write_bw figure: {}", kib, baseline.error().message);
      fmt::print("{}\n", note);
      print_note(note);
      unmeasured.push_back(fmt::format("{} KiB", kib));
    }
  }
  if (!unmeasured.empty())
    print_target(
        ">= 90% of ib_write_bw at >= 16 KiB", false,
        fmt::format("not measured: ib_write_bw gave no figure at {}", fmt::join(unmeasured, ", ")));
  else
    print_target(">= 90% of ib_write_bw at >= 16 KiB", worst >= 0.9,
                 fmt::format("worst ratio {:.2f} (soft-RoCE under TCG: the ratio only)", worst));
  return 0;
}
