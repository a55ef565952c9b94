#include "prometheus.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <set>

#include "instance/control_layout.h"
#include "metric_help.h"

namespace kvrelay::dump {

namespace {

// Counters whose value is a level, not a count of events.
const std::set<std::string> kGauges = {"live_requests", "remembered_ids"};

std::string escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

// A label name or metric-name part: [a-zA-Z0-9_], anything else an underscore.
std::string name_part(const std::string& s) {
  std::string out;
  for (char c : s)
    out.push_back(std::isalnum(static_cast<unsigned char>(c)) != 0 ? c : '_');
  return out;
}

struct Unit {
  std::string suffix;
  double scale;  // multiplies the recorded values
};

Unit unit_of(const std::string& unit) {
  if (unit == "ns") return {"seconds", 1e-9};
  if (unit == "bytes") return {"bytes", 1};
  if (unit == "MB/s") return {"bytes_per_second", 1e6};  // base units, as Prometheus asks
  return {name_part(unit), 1};
}

// One family per label, its samples for every process that has it together.
struct Process {
  std::string labels;  // instance="...",role="...",rank="..."
  CountersSnapshot counters;
};

class Writer {
 public:
  void family(const std::string& name, const std::string& type, const std::string& help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(const std::string& name, const std::string& labels, double value) {
    out_ += fmt::format("{}{{{}}} {}\n", name, labels, value);
  }
  void sample(const std::string& name, const std::string& labels, uint64_t value) {
    out_ += fmt::format("{}{{{}}} {}\n", name, labels, value);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

void write_process_metrics(Writer& w, const std::string& prefix,
                           const std::vector<Process>& processes) {
  // Counters, by label, in the first process's order.
  std::vector<std::string> labels;
  for (const Process& p : processes)
    for (const auto& [label, value] : p.counters.counters)
      if (std::find(labels.begin(), labels.end(), label) == labels.end()) labels.push_back(label);
  for (const std::string& label : labels) {
    const bool gauge = kGauges.count(label) != 0;
    const std::string name =
        fmt::format("kvrelay_{}_{}{}", prefix, name_part(label), gauge ? "" : "_total");
    w.family(name, gauge ? "gauge" : "counter", metric_help(prefix, label, false));
    for (const Process& p : processes)
      for (const auto& [l, value] : p.counters.counters)
        if (l == label) w.sample(name, p.labels, value);
  }
  // Histograms.
  std::vector<std::pair<std::string, std::string>> histograms;  // (label, unit)
  for (const Process& p : processes)
    for (const HistogramSnapshot& h : p.counters.histograms)
      if (std::find(histograms.begin(), histograms.end(), std::pair(h.label, h.unit)) ==
          histograms.end())
        histograms.emplace_back(h.label, h.unit);
  for (const auto& [label, unit] : histograms) {
    const Unit u = unit_of(unit);
    // The unit once: layer_copy_bytes in bytes is ..._layer_copy_bytes.
    const std::string base = name_part(label);
    const bool has_unit = base.size() > u.suffix.size() &&
                          base.compare(base.size() - u.suffix.size() - 1, std::string::npos,
                                       "_" + u.suffix) == 0;
    const std::string name = fmt::format("kvrelay_{}_{}{}", prefix, base,
                                         has_unit ? "" : "_" + u.suffix);
    w.family(name, "histogram",
             fmt::format("{} ({}; buckets at powers of two)", metric_help(prefix, label, true),
                         u.suffix));
    for (const Process& p : processes) {
      for (const HistogramSnapshot& h : p.counters.histograms) {
        if (h.label != label || h.unit != unit) continue;
        uint64_t cumulative = 0;
        uint32_t last = 0;
        for (uint32_t b = 0; b < kHistogramBuckets; ++b)
          if (h.buckets[b] != 0) last = b;
        // Exported at powers of two, as log2 buckets: a scrape stays small
        // and its bounds are the same in every scrape, whatever the values.
        for (uint32_t b = 0; b <= last && h.count != 0; ++b) {
          cumulative += h.buckets[b];
          const uint64_t upper = bucket_upper_bound(b);
          if (!std::has_single_bit(upper + 1) && b != last) continue;
          const double le = static_cast<double>(upper) * u.scale;
          w.sample(name + "_bucket", fmt::format("{},le=\"{}\"", p.labels, le), cumulative);
        }
        w.sample(name + "_bucket", p.labels + ",le=\"+Inf\"", h.count);
        w.sample(name + "_sum", p.labels, static_cast<double>(h.sum) * u.scale);
        w.sample(name + "_count", p.labels, h.count);
      }
    }
  }
}

}  // namespace

std::string render_prometheus(const ControlSegment& control, const InstanceView& v) {
  const std::string base = fmt::format("instance=\"{}\",role=\"{}\"", escape(v.name),
                                       role_name(static_cast<Role>(v.config.role)));
  Writer w;
  w.family("kvrelay_instance_ready", "gauge",
           "1 while the instance serves requests (state ready), else 0");
  w.sample("kvrelay_instance_ready", base, uint64_t{v.state == "ready" ? 1U : 0U});
  w.family("kvrelay_worker_ready", "gauge", "1 when the rank's worker is lined up and serving");
  for (const WorkerView& wv : v.workers)
    w.sample("kvrelay_worker_ready", fmt::format("{},rank=\"{}\"", base, wv.rank),
             uint64_t{wv.ready ? 1U : 0U});
  w.family("kvrelay_ring_fill_ratio", "gauge",
           "how full a ring is: what waits for its reader over its capacity (bytes or records)");
  for (const RingView& r : v.rings)
    w.sample("kvrelay_ring_fill_ratio", fmt::format("{},ring=\"{}\"", base, escape(r.name)),
             r.capacity == 0 ? 0.0 : static_cast<double>(r.used) / static_cast<double>(r.capacity));
  w.family("kvrelay_ring_full_events_total", "counter",
           "times a writer found the ring full (it waited or was told kFull)");
  for (const RingView& r : v.rings)
    w.sample("kvrelay_ring_full_events_total", fmt::format("{},ring=\"{}\"", base, escape(r.name)),
             r.full_events);
  if (const RingView* submit = submit_ring_of(v)) {
    w.family("kvrelay_engine_sessions", "gauge",
             "engine clients attached now (each holds one of the submit ring's producer slots)");
    w.sample("kvrelay_engine_sessions", base, static_cast<uint64_t>(submit->producer_pids.size()));
    w.family("kvrelay_engine_session_slots", "gauge",
             "the most engine clients that may be attached at once");
    w.sample("kvrelay_engine_session_slots", base, static_cast<uint64_t>(submit->producer_slots));
  }

  w.family("kvrelay_doorbell_wakes_total", "counter",
           "wake-up system calls (FUTEX_WAKE) made to wake a parked process: the coordinator, "
           "or a rank's worker");
  w.sample("kvrelay_doorbell_wakes_total", fmt::format("{},process=\"coordinator\"", base),
           v.coordinator_doorbell_wakes);
  for (const WorkerView& wv : v.workers)
    w.sample("kvrelay_doorbell_wakes_total",
             fmt::format("{},process=\"worker\",rank=\"{}\"", base, wv.rank), wv.doorbell_wakes);

  write_process_metrics(w, "coordinator",
                        {Process{base, snapshot_counters(control.counters(kCoordinatorCounters))}});
  write_process_metrics(w, "clients",
                        {Process{base, snapshot_counters(control.counters(kClientCounters))}});
  std::vector<Process> workers;
  for (uint32_t r = 0; r < v.config.tp_size; ++r)
    workers.push_back(Process{fmt::format("{},rank=\"{}\"", base, r),
                              snapshot_counters(control.counters(worker_counters_index(r)))});
  write_process_metrics(w, "worker", workers);
  return w.take();
}

}  // namespace kvrelay::dump
