// kvrelay-dump: look inside a live or dead kvrelay instance. Never writes to
// a segment and never blocks on one.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <thread>

#include "instance_view.h"
#include "metrics_server.h"
#include "prometheus.h"
#include "render.h"
#include "ring_peek.h"
#include "segment_list.h"
#include "shm/command_line.h"

using namespace kvrelay;

namespace {

Result<ControlSegment> open_instance(const std::string& instance) {
  return ControlSegment::attach(instance, AttachOptions{.access = SegmentAccess::kReadOnly,
                                                        .allow_stale = true,
                                                        .allow_unpublished = false});
}

}  // namespace

// Exit statuses (docs/operating.md): 0 healthy, 1 no such instance, 2 a
// usage error or a segment that cannot be read, 3 unhealthy or stale.
constexpr int kExitUnhealthy = 3;

int main(int argc, char** argv) {
  CLI::App app{
      "kvrelay-dump: shows an instance's header, configuration, workers, rings, barrier, counters "
      "and latency histograms, read from its shared memory without writing to it"};
  std::string instance, ring, serve;
  bool list = false, json = false, prometheus = false, clean_stale = false;
  size_t peek = 10;
  int watch_ms = 0;
  app.add_option("instance", instance, "the instance to show (--instance of its coordinator)");
  app.add_flag("--list", list,
               "list every kvrelay segment in /dev/shm: live, stale (creator gone) or foreign");
  app.add_flag("--clean-stale", clean_stale,
               "remove this user's segments that provably serve nothing (those of the named "
               "instance only, if one is named): instances whose coordinator is gone, and pools "
               "whose worker is gone and whose instance is gone or no longer has their rank; "
               "each is named with why");
  app.add_flag("--json", json,
               "machine-readable output (schema kvrelay-dump/1, see docs/operating.md)");
  app.add_flag("--prometheus", prometheus,
               "the counters and histograms in the Prometheus text exposition format 0.0.4");
  app.add_option("--serve", serve,
                 "serve the --prometheus text over HTTP at ADDRESS:PORT/metrics for a scraper "
                 "(port 0: any free one; the address and port are printed)");
  app.add_option("--watch", watch_ms, "refresh every N ms (default 1000), like top")
      ->expected(0, 1)
      ->default_str("1000");
  app.add_option(
      "--ring", ring,
      "decode the records waiting in a ring: submit, completion, task[R], landed[R] (decode "
      "instances), signal[R], report[R]");
  app.add_option("--peek", peek, "with --ring: how many records to show")->capture_default_str();
  app.footer(dump::kColumnHelp);
  kvrelay::add_version_flag(app, "kvrelay-dump");
  KVRELAY_PARSE_COMMAND_LINE(app, argc, argv);
  if (app.count("--watch") != 0 && watch_ms == 0) watch_ms = 1000;

  if (clean_stale) {
    const std::vector<dump::Removed> removed = dump::clean_stale_segments(instance);
    for (const dump::Removed& r : removed)
      fmt::print("removed /{}: {}\n", r.name, r.why);
    fmt::print("kvrelay-dump: removed {} stale segment{}\n", removed.size(),
               removed.size() == 1 ? "" : "s");
    return 0;
  }
  if (list) {
    const auto entries = dump::list_segments();
    fmt::print("{}", json ? dump::render_list_json(entries).dump(2) + "\n"
                          : dump::render_list_text(entries));
    return 0;
  }
  if (instance.empty()) {
    fmt::print(stderr, "kvrelay-dump: name an instance, or use --list\n");
    return 2;
  }
  if (!serve.empty()) {
    Result<dump::ListenAddress> at = dump::parse_listen_address(serve);
    if (!at) {
      fmt::print(stderr, "kvrelay-dump: {}\n", at.error().message);
      return 2;
    }
    // Attached anew for every scrape: a restarted instance is followed.
    auto render = [&instance]() -> dump::MetricsBody {
      Result<ControlSegment> c = open_instance(instance);
      if (!c) return {503, fmt::format("kvrelay-dump: {}\n", c.error().message)};
      return {200, dump::render_prometheus(*c, dump::snapshot(*c))};
    };
    Status s = dump::serve_metrics(*at, render, [&](uint16_t port) {
      fmt::print("kvrelay-dump: serving the metrics of instance '{}' at http://{}:{}/metrics\n",
                 instance, at->host, port);
      std::fflush(stdout);
    });
    if (!s) {
      fmt::print(stderr, "kvrelay-dump: {}\n", s.error().message);
      return 2;
    }
    return 0;
  }
  Result<ControlSegment> control = open_instance(instance);
  if (!control) {
    fmt::print(stderr, "kvrelay-dump: {}\n", control.error().message);
    return control.code() == Errc::kNotFound ? 1 : 2;
  }
  if (!ring.empty()) {
    Result<std::string> text = dump::peek_ring(*control, ring, peek);
    if (!text) {
      fmt::print(stderr, "kvrelay-dump: {}\n", text.error().message);
      return 2;
    }
    fmt::print("{}", *text);
    return 0;
  }
  if (prometheus) {
    fmt::print("{}", dump::render_prometheus(*control, dump::snapshot(*control)));
    return 0;
  }
  if (watch_ms <= 0) {
    const dump::InstanceView v = dump::snapshot(*control);
    fmt::print("{}", json ? dump::render_json(v).dump(2) + "\n" : dump::render_text(v));
    return v.health == "healthy" ? 0 : kExitUnhealthy;
  }
  std::vector<uint64_t> last_bytes;
  uint64_t last_ns = mono_now_ns();
  for (;;) {
    const dump::InstanceView v = dump::snapshot(*control);
    const uint64_t now = mono_now_ns();
    std::vector<double> rates(v.workers.size(), 0);
    for (size_t i = 0; i < v.workers.size(); ++i) {
      const uint64_t b = v.workers[i].counters.value("bytes_copied");
      if (i < last_bytes.size() && now > last_ns)
        rates[i] = static_cast<double>(b - last_bytes[i]) / static_cast<double>(now - last_ns);
      if (i >= last_bytes.size()) last_bytes.push_back(b);
      last_bytes[i] = b;
    }
    last_ns = now;
    if (json) {
      fmt::print("{}\n", dump::render_json(v).dump());
    } else {
      fmt::print("\033[H\033[2J{}", dump::render_text(v, &rates));
    }
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(watch_ms));
  }
}
