// Layer copy bandwidth: the worker's own path (plan_block_runs, then the ipc
// transport: submit a layer, poll its completion, between two shared-memory
// pools) against memcpy of the same number of bytes, in the same run.
//
//   contiguous: block ids 0..n-1 on both sides (one run per tensor)
//   scattered:  a random permutation on both sides (one memcpy per block)
//
// for block sizes 16 KiB .. 1 MiB. Target: >= 90% of memcpy. Those rows
// take every block of their pools; a third table takes one request's blocks
// from pools 1x, 4x and 20x its size, as an engine's request lies in its
// pool, under the same target.
//
// Each side starts with the destination out of the cache, as a layer's
// blocks in a pool are: the host copy streams past the cache
// (kernels/streaming_copy.h) and memcpy does not, so whichever ran first
// would otherwise leave the other a warm (memcpy) or cold (streaming)
// destination, and the ratio would measure the order, not the copies.
//
// A second table prices what the streaming costs its reader: each copy is
// followed at once by one read of every destination byte (a decode engine's
// first step on blocks that just arrived, or a swap load's engine reading
// its layer), and the pair is timed together. memcpy leaves what fits of
// the destination in the cache and streaming does not, so a layer small
// enough to stay cached is where streaming can lose; the sizes run from one
// such layer to a request's worth.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "bench_support.h"
#include "instance/pool_segment.h"
#include "kernels/block_copy.h"
#include "kernels/streaming_copy.h"
#include "shm/command_line.h"
#include "worker/copy_plan.h"
#include "worker/ipc/ipc_transport.h"

using namespace kvrelay;
using namespace kvrelay::bench;

namespace {

// Writes back and drops every cache line of [p, p + bytes).
void evict(const std::byte* p, uint64_t bytes) {
#if defined(__x86_64__)
  for (uint64_t i = 0; i < bytes; i += 64)
    _mm_clflush(p + i);
  _mm_mfence();
#else
  (void)p;
  (void)bytes;
#endif
}

struct Case {
  uint64_t block_bytes;
  bool scattered;
  // The share of each pool the request's blocks take (scattered ids only):
  // 1, every block of a pool holding just this layer; less, the same bytes
  // picked at random from a pool that many times larger, as a request's
  // blocks are from an engine's pool.
  double coverage = 1.0;
};

// Medians over the trials, GB/s of the layer's bytes: the copy alone, and
// the copy followed by one read of its destination.
struct Measured {
  double ours = 0, memcpy = 0;
  double ours_then_read = 0, memcpy_then_read = 0;
};

// Where the reads' sum goes, so that the compiler cannot drop the reads.
volatile uint64_t read_sink = 0;

// Reads every 8-byte word of [p, p + bytes) once, as a reader of the copy would.
void read_every_word(const std::byte* p, uint64_t bytes) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  uint64_t sum = 0;
  for (uint64_t i = 0; i < bytes / 8; ++i)
    sum += w[i];
  read_sink = sum;
}

// One layer of `layer_bytes` (K and V) moved, from and to pools of
// layer_bytes / coverage.
Measured measure(const Case& c, uint64_t layer_bytes, int trials) {
  PoolGeometry g;
  g.num_layers = 1;
  g.kv_heads = 1;
  g.block_size = 64;
  g.head_dim = static_cast<uint32_t>(c.block_bytes / 64 / 2);  // bf16
  g.dtype = static_cast<uint32_t>(CacheDtype::kBf16);
  const auto request_blocks = static_cast<uint32_t>(layer_bytes / 2 / c.block_bytes);
  g.num_blocks = static_cast<uint32_t>(request_blocks / c.coverage);
  const std::string tag = fmt::format("kvrelay-bench-copy-{}", getpid());
  (void)SharedSegment::unlink(tag + "-src");
  (void)SharedSegment::unlink(tag + "-dst");
  auto src = HostPool::create(tag + "-src", 0, PoolTier::kDevice, g);
  auto dst = HostPool::create(tag + "-dst", 0, PoolTier::kDevice, g);
  if (!src || !dst) {
    fmt::print(stderr, "cannot create pools: {}\n",
               src ? dst.error().message : src.error().message);
    std::exit(1);
  }
  const worker::HostSegmentPool local(std::move(src).value());
  auto peer = std::make_shared<const worker::HostSegmentPool>(std::move(dst).value());
  worker::IpcTransport transport(0, local, kernels::make_host_copy_engine());
  const std::shared_ptr<worker::Destination> destination =
      transport.destination_for(peer, "the bench's peer pool");
  std::vector<worker::TransferCompletion> completions;

  std::vector<uint32_t> src_ids(g.num_blocks), dst_ids(g.num_blocks);
  std::iota(src_ids.begin(), src_ids.end(), 0);
  std::iota(dst_ids.begin(), dst_ids.end(), 0);
  if (c.scattered) {
    std::mt19937 rng(42);
    std::shuffle(src_ids.begin(), src_ids.end(), rng);
    std::shuffle(dst_ids.begin(), dst_ids.end(), rng);
  }
  src_ids.resize(request_blocks);
  dst_ids.resize(request_blocks);
  // Touch everything once so page faults are not measured.
  for (uint32_t t = 0; t < 2; ++t) {
    std::memset(local.tensor(0, static_cast<PoolTensor>(t)), 1,
                g.tensor_bytes(0, static_cast<PoolTensor>(t)));
    std::memset(peer->tensor(0, static_cast<PoolTensor>(t)), 0,
                g.tensor_bytes(0, static_cast<PoolTensor>(t)));
  }
  const uint64_t bytes = 2 * uint64_t{request_blocks} * c.block_bytes;
  std::vector<double> ours, base, ours_read, base_read;
  // What the copy wrote, for coverage 1 (the only one the read table uses).
  auto read_destination = [&] {
    for (uint32_t t = 0; t < 2; ++t)
      read_every_word(peer->tensor(0, static_cast<PoolTensor>(t)), bytes / 2);
  };
  auto gbps = [&](uint64_t from, uint64_t to) {
    return static_cast<double>(bytes) / static_cast<double>(to - from);
  };
  auto evict_destination = [&] {
    for (uint32_t t = 0; t < 2; ++t)
      evict(peer->tensor(0, static_cast<PoolTensor>(t)),
            g.tensor_bytes(0, static_cast<PoolTensor>(t)));
  };
  for (int i = 0; i < trials; ++i) {
    evict_destination();
    const uint64_t t0 = mono_now_ns();
    auto runs = worker::plan_block_runs(src_ids, dst_ids, g.num_blocks, g.num_blocks, 0, 0);
    if (!destination->submit_layer(worker::TransferTicket{}, 0, *runs)) std::exit(1);
    completions.clear();
    while (completions.empty())
      transport.poll(completions);
    const uint64_t t1 = mono_now_ns();
    if (!completions[0].status || completions[0].bytes != bytes) std::exit(1);
    read_destination();
    const uint64_t t1_read = mono_now_ns();
    ours.push_back(gbps(t0, t1));
    ours_read.push_back(gbps(t0, t1_read));
    evict_destination();
    const uint64_t t2 = mono_now_ns();
    for (uint32_t t = 0; t < 2; ++t)
      std::memcpy(peer->tensor(0, static_cast<PoolTensor>(t)),
                  local.tensor(0, static_cast<PoolTensor>(t)), bytes / 2);
    const uint64_t t3 = mono_now_ns();
    read_destination();
    const uint64_t t3_read = mono_now_ns();
    base.push_back(gbps(t2, t3));
    base_read.push_back(gbps(t2, t3_read));
  }
  (void)local.segment().unlink();
  (void)peer->segment().unlink();
  return {median(ours), median(base), median(ours_read), median(base_read)};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvrelay layer copy bandwidth vs memcpy of the same bytes"};
  uint64_t layer_mib = 256;
  int trials = 7;
  app.add_option("--layer-mib", layer_mib, "bytes moved per layer copy (K+V), MiB")
      ->check(CLI::Range(uint64_t{1}, uint64_t{64} * 1024))
      ->capture_default_str();
  app.add_option("--trials", trials, "trials per case; the median is reported")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  kvrelay::add_version_flag(app, "kvrelay-bench-copy");
  KVRELAY_PARSE_COMMAND_LINE(app, argc, argv);

  print_header("Layer copy bandwidth (GB/s), worker path vs memcpy of the same bytes", "memcpy");
  // Which stores ran decides the result on some hosts (docs/benchmarks.md).
  const std::string stores = fmt::format(
      "the worker path streams runs of >= {} bytes with {} stores", kernels::kStreamingRunBytes,
      kernels::streaming_stores_name(kernels::streaming_stores()));
  std::printf("note   %s\n", stores.c_str());
  print_note(stores);
  double worst = 1e9;
  for (uint64_t kib : {16, 64, 256, 1024}) {
    for (bool scattered : {false, true}) {
      const Measured m = measure({kib * 1024, scattered}, layer_mib << 20, trials);
      const double ours = m.ours, base = m.memcpy;
      Row row{fmt::format("{} KiB blocks, {}", kib, scattered ? "scattered ids" : "contiguous ids"),
              "GB/s", ours, base};
      print_row(row);
      record_point(scattered ? "kvrelay, scattered ids" : "kvrelay, contiguous ids", "block KiB",
                   static_cast<double>(kib), "GB/s", ours, true);
      if (!scattered)
        record_point("memcpy", "block KiB", static_cast<double>(kib), "GB/s", base, true);
      worst = std::min(worst, row.ratio());
    }
  }
  print_target(">= 90% of memcpy", worst >= 0.9, fmt::format("worst case {:.0f}%", worst * 100));

  // The rows above take every block of their pools; an engine's request
  // takes some of a much larger pool, so its scattered runs lie further
  // apart. The same request (at most 32 MiB, a long prompt's layer) picked
  // from pools 1x, 4x and 20x its size, under the same target: memcpy of
  // the same bytes is the bound, though runs far apart each cost TLB misses
  // and a prefetcher start that it does not pay (README, row 4).
  print_header("A request's share of its pools, 16 KiB blocks, scattered ids (GB/s)", "memcpy");
  const uint64_t request_mib = std::min<uint64_t>(layer_mib, 32);
  double worst_share = 1e9;
  for (double coverage : {1.0, 0.25, 0.05}) {
    const Measured m = measure({16 * 1024, true, coverage}, request_mib << 20, trials);
    const Row row{fmt::format("{} MiB request, {:.0f}% of each pool", request_mib, coverage * 100),
                  "GB/s", m.ours, m.memcpy};
    print_row(row);
    record_point("kvrelay, scattered 16 KiB blocks", "% of the pool", coverage * 100, "GB/s",
                 m.ours, true);
    worst_share = std::min(worst_share, row.ratio());
  }
  print_target(">= 90% of memcpy, a request in a larger pool", worst_share >= 0.9,
               fmt::format("worst case {:.0f}%", worst_share * 100));

  // What the streaming costs its reader: 16 KiB blocks with scattered ids
  // (a paged cache's layer), from a layer that stays in the cache after
  // memcpy to a request's worth of layers.
  print_header(
      "Copy, then one read of every destination byte (GB/s of the layer), worker path vs memcpy",
      "memcpy");
  std::vector<uint64_t> sizes_mib{1, 8, 32, layer_mib};
  std::sort(sizes_mib.begin(), sizes_mib.end());
  sizes_mib.erase(std::unique(sizes_mib.begin(), sizes_mib.end()), sizes_mib.end());
  for (uint64_t mib : sizes_mib) {
    const Measured m = measure({16 * 1024, true}, mib << 20, trials);
    print_row({fmt::format("{} MiB layer, 16 KiB blocks, scattered ids", mib), "GB/s",
               m.ours_then_read, m.memcpy_then_read});
    record_point("kvrelay, copy then read", "layer MiB", static_cast<double>(mib), "GB/s",
                 m.ours_then_read, true);
    record_point("memcpy, copy then read", "layer MiB", static_cast<double>(mib), "GB/s",
                 m.memcpy_then_read, true);
  }
  return 0;
}
