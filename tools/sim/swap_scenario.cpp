#include "swap_scenario.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <random>

#include "block_allocator.h"
#include "instance/pool_segment.h"
#include "kv_pattern.h"
#include "quantiles.h"

namespace kvrelay::sim {

namespace {

using namespace std::chrono_literals;

}  // namespace

std::string SwapReportSummary::summary() const {
  std::string s;
  s += fmt::format("swap rounds       {} ({} failed)\n", rounds, failed);
  s += fmt::format(
      "bytes swapped     {:.1f} MiB; evict {:.2f} GB/s, load {:.2f} GB/s (p50 per round)\n",
      bytes / 1048576.0, evict_gbps, load_gbps);
  s += fmt::format(
      "layer-wise load   layer 0 usable after {:.1f} us, every layer after {:.1f} us (p50)\n",
      first_layer_ready.p50 / 1e3, all_layers_ready.p50 / 1e3);
  s += fmt::format("  layer 0 usable  {}\n", us_quantiles(first_layer_ready));
  s += fmt::format("  every layer     {}\n", us_quantiles(all_layers_ready));
  s += fmt::format("verification      {} wrong words: {}\n", wrong_words,
                   ok() ? "every byte verified" : "FAILED");
  if (!first_error.empty()) s += fmt::format("first problem     {}\n", first_error);
  return s;
}

SwapReportSummary run_swap_scenario(const SwapOptions& o, Client& client) {
  SwapReportSummary report;
  const uint32_t tp = client.info().tp_size;
  std::vector<std::unique_ptr<PoolView>> device, host;
  for (uint32_t r = 0; r < tp; ++r) {
    auto d = client.open_pool(r, PoolTier::kDevice);
    auto h = client.open_pool(r, PoolTier::kHost);
    if (!d || !h) {
      report.failed = 1;
      report.first_error =
          fmt::format("rank {}: {}", r, !d ? d.error().message : h.error().message);
      return report;
    }
    device.push_back(std::make_unique<PoolView>(std::move(d).value()));
    host.push_back(std::make_unique<PoolView>(std::move(h).value()));
  }
  const PoolGeometry& g = device[0]->geometry();
  BlockAllocator device_blocks(g.num_blocks, o.seed);
  BlockAllocator host_blocks(host[0]->geometry().num_blocks, o.seed + 1);
  std::mt19937_64 rng(o.seed);
  std::vector<uint64_t> first_ready, all_ready;
  std::vector<double> evict_rates, load_rates;

  auto fail = [&](const std::string& why) {
    ++report.failed;
    if (report.first_error.empty()) report.first_error = why;
  };
  auto finish = [&](const std::string& id) -> std::optional<Completion> {
    Result<Completion> c = client.wait(Deadline::after(60s));
    if (!c) {
      fail(fmt::format("'{}': {}", id, c.error().message));
      return std::nullopt;
    }
    if (c->request_id != id || c->status != CompletionStatus::kFinished) {
      fail(
          fmt::format("'{}': {} {}", c->request_id, completion_status_name(c->status), c->message));
      return std::nullopt;
    }
    return *c;
  };

  for (uint32_t round = 0; round < o.rounds; ++round) {
    const auto n = std::uniform_int_distribution<uint32_t>(1, o.max_blocks)(rng);
    auto dev = device_blocks.take(n);
    auto hst = host_blocks.take(n);
    if (!dev || !hst) break;
    const RequestBlocks blocks{round + 1, *dev, {}};
    for (uint32_t r = 0; r < tp; ++r)
      fill_request(*device[r], r, blocks);
    SwapSpec s;
    s.request_id = fmt::format("evict-{}", round);
    s.device_block_ids = *dev;
    s.host_block_ids = *hst;
    if (Status st = client.submit(s, Deadline::after(10s)); !st) {
      fail(st.error().message);
      break;
    }
    auto evicted = finish(s.request_id);
    if (!evicted) break;
    report.bytes += evicted->bytes_moved;
    if (evicted->completed_ns > evicted->submitted_ns)
      evict_rates.push_back(static_cast<double>(evicted->bytes_moved) /
                            static_cast<double>(evicted->completed_ns - evicted->submitted_ns));
    // The engine reuses the device blocks meanwhile.
    for (uint32_t r = 0; r < tp; ++r)
      for (uint32_t l = 0; l < g.total_layers(); ++l)
        for (uint32_t t : tensor_ids(g))
          for (uint32_t b : *dev)
            poison_block(*device[r], l, t, b);
    s.request_id = fmt::format("load-{}", round);
    s.load = true;
    const uint64_t t0 = mono_now_ns();
    if (Status st = client.submit(s, Deadline::after(10s)); !st) {
      fail(st.error().message);
      break;
    }
    // The forward pass: layer by layer, as soon as each is back.
    for (uint32_t l = 0; l < g.total_layers(); ++l) {
      if (Status st = client.wait_layer(s.request_id, l, Deadline::after(60s)); !st) {
        fail(fmt::format("wait for layer {} of '{}': {}", l, s.request_id, st.error().message));
        break;
      }
      const uint64_t ready = mono_now_ns() - t0;
      if (l == 0) first_ready.push_back(ready);
      if (l + 1 == g.total_layers()) all_ready.push_back(ready);
      for (uint32_t r = 0; r < tp; ++r)
        for (uint32_t t : tensor_ids(g))
          for (uint32_t i = 0; i < dev->size(); ++i)
            report.wrong_words +=
                check_block(*device[r], (*dev)[i], BlockTag{blocks.tag, l, t, i, r});
    }
    auto loaded = finish(s.request_id);
    if (!loaded) break;
    report.bytes += loaded->bytes_moved;
    if (loaded->completed_ns > loaded->submitted_ns)
      load_rates.push_back(static_cast<double>(loaded->bytes_moved) /
                           static_cast<double>(loaded->completed_ns - loaded->submitted_ns));
    device_blocks.give_back(*dev);
    host_blocks.give_back(*hst);
    ++report.rounds;
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  report.evict_gbps = median(evict_rates);
  report.load_gbps = median(load_rates);
  report.first_layer_ready = exact_quantiles(first_ready);
  report.all_layers_ready = exact_quantiles(all_ready);
  return report;
}

}  // namespace kvrelay::sim
