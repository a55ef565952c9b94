// Requests through real instances (a prefill and a decode coordinator with
// their workers), measured from the engine's side.
//
//   dispatch  the engine submits a request's decode half (its layer already
//             signalled) -> a worker begins the copy (Completion.first_copy_ns),
//             against the original's control path (a manager queue polled
//             every 1 ms, tools/bench/manager_baseline.py) in the same run;
//             and the completion path (last layer signal -> completion read).
//             Both hop by hop, both against a bare chain of as many wake-ups
//             (wake_floor.h), for each --idle-strategy asked for.
//   scaling   single-block requests per second through one prefill
//             coordinator, against tp, requests in flight, and layers.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <optional>
#include <thread>

#include "bench_support.h"
#include "hop_breakdown.h"
#include "instance_pair.h"
#include "shm/clock.h"
#include "shm/wait_event.h"
#include "wake_floor.h"
#include "shm/command_line.h"

namespace kvrelay::bench {
namespace {

using namespace std::chrono_literals;

bool check(const Status& s, const char* what) {
  if (!s) std::fprintf(stderr, "bench: %s: %s\n", what, s.error().message.c_str());
  return s.ok();
}

// Waits for `count` completions; returns how many finished.
size_t await_completions(Client& client, size_t count) {
  size_t finished = 0;
  for (size_t i = 0; i < count; ++i) {
    auto c = client.wait(Deadline::after(30s));
    if (!c) {
      std::fprintf(stderr, "bench: waiting for completions: %s\n", c.error().message.c_str());
      return finished;
    }
    if (c->status == CompletionStatus::kFinished) {
      ++finished;
    } else {
      std::fprintf(stderr, "bench: '%s' did not finish: %s\n", c->request_id.c_str(),
                   c->message.c_str());
    }
  }
  return finished;
}

CacheDestSpec dest_spec(const InstancePair& pair, std::string id, std::vector<uint32_t> blocks) {
  CacheDestSpec d;
  d.request_id = std::move(id);
  d.dest_block_ids = std::move(blocks);
  d.protocol = Protocol::kIpc;
  d.peer_instance = pair.decode_name();
  for (uint32_t r = 0; r < pair.tp(); ++r)
    d.device_ids.push_back(r);
  return d;
}

// ---- dispatch and completion ----

// Every process parks between requests, as it does between an engine's
// requests: what is measured is the cold path.
constexpr auto kSettle = 300us;

struct PathSamples {
  std::vector<double> dispatch_us;    // CacheDest submit -> first copy begins
  std::vector<double> completion_us;  // last layer signal pushed -> completion read
};

bool finished(Client& client, const std::string& id) {
  auto c = client.wait(Deadline::after(5s));
  if (!c || c->status != CompletionStatus::kFinished || c->request_id != id) {
    std::fprintf(stderr, "bench: request %s did not finish: %s\n", id.c_str(),
                 !c ? c.error().message.c_str() : c->message.c_str());
    return false;
  }
  return true;
}

// Each sample is two requests:
//   dispatch    its layer signalled before its halves arrive, so that when
//               the decode half arrives nothing but dispatch stands between
//               it and the copy (Completion.first_copy_ns says when it began);
//   completion  both halves bound first, then the last layer's signal; until
//               the engine reads the completion.
// Each request's hops are read around it alone.
std::optional<PathSamples> measure_paths(uint32_t tp, int samples, IdleStrategy idle) {
  sim::Geometry g;
  g.tp = tp;
  g.layers = 1;
  g.blocks = 16;
  g.block_size = 64;
  g.head_dim = 64;
  auto started =
      InstancePair::start(g, "dispatch", {"--idle-strategy", idle_strategy_name(idle)});
  if (!started) {
    std::fprintf(stderr, "bench: %s\n", started.error().message.c_str());
    return std::nullopt;
  }
  InstancePair& pair = **started;
  Client& client = pair.prefill();
  constexpr uint32_t kSrc = 1, kDst = 2, kSlot = 0;
  std::atomic_ref<uint64_t> src_word(
      *reinterpret_cast<uint64_t*>(pair.src(0).block(0, PoolTensor::kKey, kSrc)));
  std::atomic_ref<uint64_t> dst_word(
      *reinterpret_cast<uint64_t*>(pair.dst(0).block(0, PoolTensor::kKey, kDst)));
  HopBreakdown dispatch_hops_seen(pair.prefill_control(), dispatch_hops());
  HopBreakdown completion_hops_seen(pair.prefill_control(), completion_hops());
  const int warmup = 20;
  PathSamples out;
  uint64_t step = 0;
  auto push = [&](const std::string& id, bool batch, bool layer) {
    const BatchSlot slot{kSlot, 0, g.block_size, Client::request_tag(id)};
    for (uint32_t r = 0; r < tp; ++r) {
      if (batch && !check(client.push_batch(r, step, {&slot, 1}, Deadline::after(1s)), "push_batch"))
        return false;
      if (layer && !check(client.push_layer_done(r, step, 0, Deadline::after(1s)),
                          "push_layer_done"))
        return false;
    }
    return true;
  };
  for (int i = 0; i < warmup + samples; ++i) {
    const bool measured = i >= warmup;
    for (const bool dispatch : {true, false}) {
      const std::string id = fmt::format("{}{}", dispatch ? 'd' : 'c', i);
      const uint64_t mark = ++step;
      src_word.store(mark, std::memory_order_relaxed);
      dst_word.store(0, std::memory_order_relaxed);
      CacheTaskSpec task{id, {kSrc}, g.block_size, kSlot, std::nullopt, 0};
      const CacheDestSpec dest = dest_spec(pair, id, {kDst});
      HopBreakdown& hops = dispatch ? dispatch_hops_seen : completion_hops_seen;
      uint64_t t0 = 0, t1 = 0;
      if (dispatch) {
        if (!push(id, true, true) || !check(client.submit(task, Deadline::after(1s)), "CacheTask"))
          return std::nullopt;
        std::this_thread::sleep_for(kSettle);
        if (measured) hops.begin();
        t0 = mono_now_ns();
        if (!check(client.submit(dest, Deadline::after(1s)), "CacheDest")) return std::nullopt;
        // Waits parked, as an engine does: a spinning observer would take
        // the core the coordinator or the worker needs.
        auto c = client.wait(Deadline::after(5s));
        if (!c || c->status != CompletionStatus::kFinished || c->request_id != id) {
          std::fprintf(stderr, "bench: request %s did not finish: %s\n", id.c_str(),
                       !c ? c.error().message.c_str() : c->message.c_str());
          return std::nullopt;
        }
        t1 = c->first_copy_ns;
      } else {
        if (!push(id, true, false) || !check(client.submit(task, Deadline::after(1s)), "CacheTask") ||
            !check(client.submit(dest, Deadline::after(1s)), "CacheDest"))
          return std::nullopt;
        std::this_thread::sleep_for(kSettle);
        if (measured) hops.begin();
        t0 = mono_now_ns();
        if (!push(id, false, true) || !finished(client, id)) return std::nullopt;
        t1 = mono_now_ns();
      }
      if (measured) hops.end();
      if (dst_word.load(std::memory_order_acquire) != mark || t1 < t0) {
        std::fprintf(stderr, "bench: request %s: its bytes did not land, or its times are off\n",
                     id.c_str());
        return std::nullopt;
      }
      if (measured)
        (dispatch ? out.dispatch_us : out.completion_us)
            .push_back(static_cast<double>(t1 - t0) / 1e3);
    }
  }
  const std::string how = fmt::format("tp={} {}", tp, idle_strategy_name(idle));
  dispatch_hops_seen.print(how + " dispatch");
  completion_hops_seen.print(how + " completion");
  return out;
}

struct Floors {
  Percentiles two_hops, three_hops;
};

std::optional<Floors> measure_floors(int samples, IdleStrategy idle) {
  const std::vector<double> two =
      measure_wake_chain(2, samples, idle, static_cast<uint32_t>(kSettle.count()));
  const std::vector<double> three =
      measure_wake_chain(3, samples, idle, static_cast<uint32_t>(kSettle.count()));
  if (two.empty() || three.empty()) return std::nullopt;
  return Floors{percentiles(two), percentiles(three)};
}

// Spinning processes of a measured case: the prefill coordinator and its
// workers (kvrelay), or the chain's links (the floor).
uint32_t spinners(IdleStrategy idle, uint32_t processes) {
  return idle == IdleStrategy::kSpin ? processes : 0;
}

// "ours against the floor" rows and the target (docs/latency.md). A spin
// target holds only on dedicated cores: with more spinning processes than
// CPUs the scheduler time-slices them, and that is all either side shows.
void report_against_floor(const std::string& what, const Percentiles& ours,
                          const Percentiles& floor, double limit, uint32_t spinning) {
  print_row(Row{what + ", p50 vs the wake floor", "us", ours.p50, floor.p50, false});
  print_row(Row{what + ", p99 vs the wake floor", "us", ours.p99, floor.p99, false});
  const double multiple = floor.p50 > 0 ? ours.p50 / floor.p50 : 0;
  const std::string detail =
      fmt::format("{:.1f} us = {:.1f}x the floor's {:.1f} us", ours.p50, multiple, floor.p50);
  const auto cpus = static_cast<uint32_t>(std::thread::hardware_concurrency());
  if (spinning + 1 > cpus) {  // + 1: the engine
    const std::string note = fmt::format(
        "{}: {}; not a target here: {} spinning processes and the engine on {} CPUs are not "
        "dedicated cores",
        what, detail, spinning, cpus);
    std::printf("note   %s\n", note.c_str());
    print_note(note);
    return;
  }
  print_target(fmt::format("{} p50 <= {:.1f}x the wake floor", what, limit),
               multiple > 0 && multiple <= limit, detail);
}

int run_dispatch(int samples, const std::string& python, const std::string& script,
                 const std::vector<IdleStrategy>& idles) {
  print_header("Dispatch: submit -> a worker starts the copy (microseconds, lower is better)",
               "manager queue");
  const PythonBaseline base =
      run_python_baseline(python, script, fmt::format("dispatch --samples {}", samples));
  std::vector<std::pair<std::string, PathSamples>> runs;
  for (IdleStrategy idle : idles) {
    for (uint32_t tp : {1U, 2U}) {
      std::optional<PathSamples> s = measure_paths(tp, samples, idle);
      if (!s) return 1;
      const std::string how = fmt::format("tp={} {}", tp, idle_strategy_name(idle));
      const Percentiles ours = percentiles(s->dispatch_us);
      Row p50{how + " submit -> copy starts, p50", "us", ours.p50, base.p50_us, false};
      Row p99{how + " submit -> copy starts, p99", "us", ours.p99, base.p99_us, false};
      print_row(p50);
      print_row(p99);
      if (base.ok && idle == IdleStrategy::kPark)
        print_target(fmt::format("{} dispatch >= 80x at p50, p50 <= 10 us", how),
                     p50.ratio() >= 80.0 && ours.p50 <= 10.0,
                     fmt::format("p50 {:.1f} us vs {:.0f} us: {:.0f}x", ours.p50, base.p50_us,
                                 p50.ratio()));
      runs.emplace_back(how, std::move(*s));
    }
  }
  if (!base.ok)
    std::printf("(no baseline: pass --python-baseline tools/bench/manager_baseline.py)\n");

  // The floor: the same wake-ups with no work, in the same run.
  print_header("Dispatch and completion against the wake floor (microseconds, lower is better)",
               "wake floor");
  size_t at = 0;
  for (IdleStrategy idle : idles) {
    const std::optional<Floors> floor = measure_floors(samples, idle);
    if (!floor) return 1;
    const double limit = idle == IdleStrategy::kSpin ? 1.5 : 3.0;
    for (uint32_t tp : {1U, 2U}) {
      const auto& [how, s] = runs.at(at++);
      report_against_floor(how + " dispatch (2 hops)", percentiles(s.dispatch_us),
                           floor->two_hops, limit, spinners(idle, 1 + tp));
      report_against_floor(how + " completion (3 hops)", percentiles(s.completion_us),
                           floor->three_hops, limit, spinners(idle, 1 + tp));
    }
  }
  return 0;
}

// ---- scaling ----

struct Point {
  double requests_per_s = 0;
  double us_per_request = 0;
};

// Rounds of `concurrency` single-block requests (both halves, the batch and
// every layer's signal on every rank), each round waited for, until
// `min_seconds` have passed.
std::optional<Point> measure_point(uint32_t tp, uint32_t concurrency, uint32_t layers,
                                   double min_seconds, IdleStrategy idle) {
  sim::Geometry g;
  g.tp = tp;
  g.layers = layers;
  g.blocks = concurrency + 8;
  g.block_size = 16;
  g.head_dim = 64;  // 2 KiB per block and tensor
  auto started = InstancePair::start(g, "scale", {"--idle-strategy", idle_strategy_name(idle)});
  if (!started) {
    std::fprintf(stderr, "bench: %s\n", started.error().message.c_str());
    return std::nullopt;
  }
  InstancePair& pair = **started;
  Client& client = pair.prefill();
  uint64_t step = 0, done = 0, next_id = 0;
  std::vector<BatchSlot> batch(concurrency);
  auto round = [&]() -> bool {
    ++step;
    for (uint32_t j = 0; j < concurrency; ++j) {
      const std::string id = fmt::format("s{}", next_id++);
      CacheTaskSpec task{id, {j}, g.block_size, j, std::nullopt, 0};
      if (!check(client.submit(task, Deadline::after(10s)), "submit CacheTask")) return false;
      if (!check(client.submit(dest_spec(pair, id, {j}), Deadline::after(10s)), "submit CacheDest"))
        return false;
      batch[j] = BatchSlot{j, 0, g.block_size, Client::request_tag(id)};
    }
    for (uint32_t r = 0; r < tp; ++r) {
      if (!check(client.push_batch(r, step, batch, Deadline::after(10s)), "push_batch"))
        return false;
      for (uint32_t l = 0; l < layers; ++l)
        if (!check(client.push_layer_done(r, step, l, Deadline::after(10s)), "push_layer_done"))
          return false;
    }
    return await_completions(client, concurrency) == concurrency;
  };
  if (!round()) return std::nullopt;  // warm-up: first touches, first wakes
  const uint64_t t0 = mono_now_ns();
  double elapsed = 0;
  while (elapsed < min_seconds || done < 4 * concurrency) {
    if (!round()) return std::nullopt;
    done += concurrency;
    elapsed = static_cast<double>(mono_now_ns() - t0) / 1e9;
  }
  return Point{static_cast<double>(done) / elapsed, elapsed * 1e6 / static_cast<double>(done)};
}

int run_scaling(double seconds, bool quick, const std::vector<IdleStrategy>& idles) {
  print_header("Scaling: single-block requests through one coordinator", "-");
  const std::vector<uint32_t> tps =
      quick ? std::vector<uint32_t>{1, 2} : std::vector<uint32_t>{1, 2, 4, 8};
  const std::vector<uint32_t> concurrencies =
      quick ? std::vector<uint32_t>{1, 64, 512} : std::vector<uint32_t>{1, 4, 16, 64, 256, 512};
  const std::vector<uint32_t> layer_counts =
      quick ? std::vector<uint32_t>{1, 16} : std::vector<uint32_t>{1, 4, 16, 64, 128};
  for (uint32_t tp : tps) {
    auto p = measure_point(tp, 128, 1, seconds, IdleStrategy::kPark);
    if (!p) return 1;
    record_point("vs tp (128 in flight, 1 layer)", "tp", tp, "requests/s", p->requests_per_s);
    record_point("per request vs tp", "tp", tp, "us", p->us_per_request);
  }
  double best_tp2 = 0;
  for (uint32_t c : concurrencies) {
    auto p = measure_point(2, c, 1, seconds, IdleStrategy::kPark);
    if (!p) return 1;
    best_tp2 = std::max(best_tp2, p->requests_per_s);
    record_point("vs in flight (tp 2, 1 layer)", "in flight", c, "requests/s", p->requests_per_s);
    record_point("per request vs in flight", "in flight", c, "us", p->us_per_request);
  }
  for (uint32_t l : layer_counts) {
    auto p = measure_point(2, 64, l, seconds, IdleStrategy::kPark);
    if (!p) return 1;
    record_point("vs layers (tp 2, 64 in flight)", "layers", l, "requests/s", p->requests_per_s);
    record_point("per request vs layers", "layers", l, "us", p->us_per_request);
  }
  print_target("tp=2 single-block requests >= 100,000/s (park)", best_tp2 >= 100'000,
               fmt::format("best {:.0f} requests/s", best_tp2));
  // The other idle strategies, side by side with park at the best-known
  // points (tp 2, 64 and 512 in flight).
  for (IdleStrategy idle : idles) {
    if (idle == IdleStrategy::kPark) continue;
    double best = 0;
    for (uint32_t c : {64U, 512U}) {
      auto p = measure_point(2, c, 1, seconds, idle);
      if (!p) return 1;
      best = std::max(best, p->requests_per_s);
    }
    print_row(Row{fmt::format("tp=2 requests/s, {} vs park", idle_strategy_name(idle)), "/s", best,
                  best_tp2, true});
    const auto cpus = static_cast<uint32_t>(std::thread::hardware_concurrency());
    const std::string detail = fmt::format("best {:.0f} requests/s", best);
    if (idle == IdleStrategy::kSpin && 3 + 1 > cpus) {  // coordinator, 2 workers, the engine
      const std::string note = fmt::format(
          "tp=2 spin: {}; not a target here: 3 spinning processes and the engine on {} CPUs",
          detail, cpus);
      std::printf("note   %s\n", note.c_str());
      print_note(note);
    } else {
      print_target(fmt::format("tp=2 single-block requests >= 100,000/s ({})",
                               idle_strategy_name(idle)),
                   best >= 100'000, detail);
    }
  }
  return 0;
}

}  // namespace
}  // namespace kvrelay::bench

int main(int argc, char** argv) {
  using namespace kvrelay::bench;
  CLI::App app{"kvrelay request benchmarks: dispatch latency and scaling, through real instances"};
  app.require_subcommand(1);
  int samples = 500;
  std::string python = "python3";
  std::string script;
  auto* dispatch = app.add_subcommand("dispatch", "submit -> copy, against the original's queue");
  dispatch->add_option("--samples", samples, "requests measured per case")
      ->check(CLI::Range(10, 100'000))
      ->capture_default_str();
  dispatch->add_option("--python-baseline", script, "tools/bench/manager_baseline.py");
  dispatch->add_option("--python", python, "the interpreter for the baseline")
      ->capture_default_str();
  double seconds = 1.0;
  bool quick = false;
  auto* scaling =
      app.add_subcommand("scaling", "requests/s against tp, in-flight requests, layers");
  scaling->add_option("--seconds", seconds, "measuring time per point")
      ->check(CLI::Range(0.1, 60.0))
      ->capture_default_str();
  scaling->add_flag("--quick", quick, "fewer points");
  std::string idle_list = "park,spin";
  for (CLI::App* sub : {dispatch, scaling})
    sub->add_option("--idle-strategies", idle_list,
                    "the prefill coordinator's and workers' --idle-strategy values to measure")
        ->capture_default_str();
  kvrelay::add_version_flag(app, "kvrelay-bench-requests");
  KVRELAY_PARSE_COMMAND_LINE(app, argc, argv);
  std::vector<kvrelay::IdleStrategy> idles;
  for (size_t at = 0; at <= idle_list.size();) {
    const size_t comma = std::min(idle_list.find(',', at), idle_list.size());
    kvrelay::IdleStrategy s{};
    if (!kvrelay::parse_idle_strategy(std::string_view(idle_list).substr(at, comma - at), s)) {
      std::fprintf(stderr, "--idle-strategies: '%s': expected park, backoff or spin, comma-separated\n",
                   idle_list.c_str());
      return 2;
    }
    idles.push_back(s);
    at = comma + 1;
  }
  if (*dispatch) return run_dispatch(samples, python, script, idles);
  return run_scaling(seconds, quick, idles);
}
