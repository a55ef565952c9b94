#include "render.h"

#include <fmt/format.h>

#include <initializer_list>
#include <map>

#include "instance/head_layout.h"

namespace kvrelay::dump {

const char* const kColumnHelp = R"(Columns:
  instance      name, layout version, epoch (grows by one at every coordinator start) and state
                (initialising, ready, draining, dead); "STALE" when the coordinator that created the
                segment is gone (then nothing is serving it)
  health        healthy, or unhealthy followed by every problem that stops requests from flowing:
                a stale or silent coordinator, a rank not ready (with why its worker is down:
                "restarting after: ..." or "not restarted: ..."), a ring whose shared state is
                corrupt, a ring blocked by a producer that stopped mid-record
  coordinator   pid, slot state, health (healthy: heartbeat fresh; silent: heartbeat older than
                peer_timeout_ms but the process exists; dead: the process is gone) and heartbeat age
  config        TP size, role, pool geometry (layers + extra layers, blocks, tokens per block, KV heads,
                head dim, dtype, fp8 scales), host-tier blocks, default request deadline
  workers       rank, pid, slot state, health, heartbeat age, ready flag (the original's
                cache_ready_signal), starts (how many processes have served the rank), tasks read,
                layer copies, bytes copied, requests finished / failed / cancelled, and the copy rate
                (p50 of per-copy rates; in --watch, the rate over the last refresh)
  stalled       requests a rank's watchdog found not finished stall_report_ms after their final chunk
                was signalled there (or after they ended with transfers in flight), with how long
                and what each waits for: its CacheDest, transfers in flight (to which peer), or
                its transfers before it reports its end; shown only when there are some
  network       per rank, what it sent (tcp lanes and rdma sessions opened, lost after serving,
                connect attempts that reached no one) and received (connections accepted, refused
                for failed authentication or handshake; tcp frames and bytes landed, frames refused;
                rdma sessions, transfers landed, intents refused); a direction never used is left out
  rings         name, kind (mpsc: variable records, sizes in bytes; spsc: fixed records, sizes in
                records), capacity, used, head (consumer position), tail (producer position), full
                events (writes refused or delayed because the ring was full), skipped (half-written
                records of dead producers that were given up), corrupt (records found defective plus
                times its shared state was found overwritten by another process; the state column
                says whether it is still unusable), parked (processes sleeping on the ring); the
                completion ring names its one reader (pid and engine session) while it lives
  sessions      engine clients attached now, of the most that may be (each holds one of the submit
                ring's producer slots until it is destroyed or its process exits), and their processes
  barrier       generation (advances by 1 per round, completed or poisoned), parties,
                arrived in the current round, rounds completed, rounds poisoned, waits that timed out
  woken         wake-up system calls (FUTEX_WAKE) made to wake the coordinator and each rank while
                it was parked on its doorbell: against the requests finished, how often a request
                wakes a process
  latency       histograms as p50 / p90 / p99 / p99.9 / max with their unit; log-linear buckets,
                so a quantile is within 1.6% of the exact value (max is exact). Hops of the
                dispatch path (submit -> copy start) and the completion path (copy done ->
                engine read) have a histogram each; see docs/latency.md
)";

namespace {

std::string bytes(uint64_t b) {
  if (b >= (1ULL << 30)) return fmt::format("{:.1f} GiB", b / 1073741824.0);
  if (b >= (1ULL << 20)) return fmt::format("{:.1f} MiB", b / 1048576.0);
  if (b >= (1ULL << 10)) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", b);
}

// The submit ring's live producers are the engine clients attached now: how
// many of the slots they hold, and which processes (one pid may hold many).
std::string engine_sessions_line(const RingView& submit) {
  std::map<uint32_t, uint32_t> per_pid;
  for (uint32_t pid : submit.producer_pids)
    ++per_pid[pid];
  std::string who;
  for (const auto& [pid, n] : per_pid)
    who += fmt::format("{}pid {}{}", who.empty() ? ": " : ", ", pid,
                       n > 1 ? fmt::format(" (x{})", n) : std::string());
  return fmt::format("\nsessions {} of {} engine sessions open{}\n", submit.producer_pids.size(),
                     submit.producer_slots, who);
}

std::string quantity(uint64_t v, const std::string& unit) {
  if (unit == "ns") {
    if (v >= 1'000'000'000ULL) return fmt::format("{:.2f} s", v / 1e9);
    if (v >= 1'000'000ULL) return fmt::format("{:.2f} ms", v / 1e6);
    if (v >= 1'000ULL) return fmt::format("{:.1f} us", v / 1e3);
    return fmt::format("{} ns", v);
  }
  if (unit == "bytes") return bytes(v);
  return fmt::format("{} {}", v, unit);
}

void histograms(std::string& out, const std::string& who, const CountersView& c) {
  for (const auto& [label, h] : c.histograms) {
    if (h.count == 0) continue;
    out += fmt::format(
        "  {:<12} {:<26} n={:<9} p50 {:>10}  p90 {:>10}  p99 {:>10}  p99.9 {:>10}  max {:>10}\n",
        who, label, h.count, quantity(h.p50, h.unit), quantity(h.p90, h.unit),
        quantity(h.p99, h.unit), quantity(h.p999, h.unit), quantity(h.max, h.unit));
  }
}

// A rank's network counters (worker_counters.h), as a line each for what it
// sent and what it received; nothing for a direction it never used.
void network(std::string& out, const WorkerView& w) {
  const CountersView& c = w.counters;
  const auto any = [&](std::initializer_list<const char*> labels) {
    for (const char* l : labels)
      if (c.value(l) != 0) return true;
    return false;
  };
  if (any({"tcp_lanes_opened", "tcp_connect_failures", "rdma_sessions_opened",
           "rdma_connect_failures"}))
    out += fmt::format(
        "  rank {} sends     tcp lanes opened {}  lost {}  connect failures {}   rdma sessions "
        "opened {}  lost {}  connect failures {}\n",
        w.rank, c.value("tcp_lanes_opened"), c.value("tcp_lanes_lost"),
        c.value("tcp_connect_failures"), c.value("rdma_sessions_opened"),
        c.value("rdma_sessions_lost"), c.value("rdma_connect_failures"));
  if (any({"net_connections_accepted", "net_connections_refused"}))
    out += fmt::format(
        "  rank {} receives  connections accepted {}  refused {}   tcp frames {} ({})  refused "
        "{}   rdma sessions {}  transfers {}  refused {}\n",
        w.rank, c.value("net_connections_accepted"), c.value("net_connections_refused"),
        c.value("tcp_frames_received"), bytes(c.value("tcp_bytes_received")),
        c.value("tcp_frames_refused"), c.value("rdma_sessions_accepted"),
        c.value("rdma_transfers_received"), c.value("rdma_intents_refused"));
}

}  // namespace

std::string render_text(const InstanceView& v, const std::vector<double>* rates) {
  std::string out;
  const InstanceConfig& c = v.config;
  // The health first: a probe reads one line (and the exit status).
  out += fmt::format("health {}\n", v.health);
  for (const std::string& p : v.problems)
    out += fmt::format("  - {}\n", p);
  out += fmt::format("instance {}  (layout v{}, epoch {}, {}{})\n", v.name, v.layout_version,
                     v.epoch, v.state, v.stale ? fmt::format(", STALE: {}", v.stale_reason) : "");
  out += fmt::format("coordinator pid {}  {}  {}  heartbeat {:.0f} ms ago\n", v.coordinator.pid,
                     v.coordinator.state, v.coordinator.health, v.coordinator.heartbeat_age_ms);
  out += fmt::format(
      "config  tp {}  role {}  layers {}+{}  blocks {} (extra layers: {})  block {} tokens  "
      "kv_heads {} ({} in all)  head_dim {}  dtype {}{}  pool {}  host blocks {}  deadline {} ms\n",
      c.tp_size, role_name(static_cast<Role>(c.role)), c.num_layers, c.extra_layers, c.num_blocks,
      c.extra_layer_blocks, c.block_size, c.kv_heads, head_layout_of(c).total_heads, c.head_dim,
      dtype_name(static_cast<CacheDtype>(c.dtype)),
      fmt::format("{}{}", c.has_scales ? " +scales" : "", c.k_only ? " K only (no V)" : ""),
      c.engine_pools != 0 ? "none" : "host", c.host_blocks, c.request_deadline_ms);
  out += "\nworkers\n";
  out += fmt::format(
      "  {:>4} {:>8} {:<9} {:<8} {:>10} {:>5} {:>6} {:>8} {:>10} {:>11} {:>9} {:>7} {:>9} {:>10}\n",
      "rank", "pid", "state", "health", "heartbeat", "ready", "starts", "tasks", "copies", "bytes",
      "finished", "failed", "cancelled", "GB/s");
  for (size_t i = 0; i < v.workers.size(); ++i) {
    const WorkerView& w = v.workers[i];
    double gbps = 0;
    if (rates != nullptr && i < rates->size()) {
      gbps = (*rates)[i];
    } else {
      for (const auto& [label, h] : w.counters.histograms)
        if (label == "layer_copy_rate") gbps = h.p50 / 1000.0;
    }
    out += fmt::format(
        "  {:>4} {:>8} {:<9} {:<8} {:>7.0f} ms {:>5} {:>6} {:>8} {:>10} {:>11} {:>9} {:>7} {:>9} "
        "{:>10.2f}\n",
        w.rank, w.process.pid, w.process.state, w.process.health, w.process.heartbeat_age_ms,
        w.ready ? "yes" : "no", w.process.registrations, w.counters.value("tasks"),
        w.counters.value("layer_copies"), bytes(w.counters.value("bytes_copied")),
        w.counters.value("requests_finished"), w.counters.value("requests_failed"),
        w.counters.value("requests_cancelled"), gbps);
  }
  out += "\npools\n";
  for (const WorkerView& w : v.workers) {
    for (const PoolEntryView& p : w.pools)
      out += fmt::format(
          "  rank {} {:<6} {:<12} {}{}{}\n", w.rank, p.tier,
          p.location.empty() ? "none" : p.location,
          p.location.empty() && p.tier == "device" && c.engine_pools != 0
              ? "(--pool none: the engine has registered none yet; transfers fail until it does)"
              : p.name,
          p.bytes != 0 ? fmt::format(" ({})", bytes(p.bytes)) : "",
          p.location.rfind("cuda", 0) == 0 ? fmt::format(" on GPU {}", p.device_id) : "");
    if (w.device_signal_word != 0)
      out += fmt::format("  rank {} GPU-signalled layers: {}\n", w.rank, w.device_signal_word);
  }
  bool any_stalled = false;
  for (const WorkerView& w : v.workers)
    any_stalled = any_stalled || w.stalled != 0;
  if (any_stalled) {
    out += fmt::format(
        "\nstalled requests (not finished {} ms after their final chunk was "
        "signalled on the rank)\n",
        v.config.stall_report_ms);
    for (const WorkerView& w : v.workers) {
      for (const StallView& s : w.stalls)
        out += fmt::format(
            "  rank {} '{}' slot {}: {:.1f} s, {}{}\n", w.rank, s.request_id, s.slot, s.seconds,
            s.waiting_for,
            s.in_flight != 0 ? fmt::format(" ({} to {})", s.in_flight, s.peer) : std::string());
      if (w.stalled > w.stalls.size())
        out += fmt::format("  rank {}: {} more\n", w.rank, w.stalled - w.stalls.size());
    }
  }
  out += "\nnetwork\n";
  const size_t network_start = out.size();
  for (const WorkerView& w : v.workers)
    network(out, w);
  if (out.size() == network_start) out += "  nothing sent or received over tcp or rdma yet\n";
  out += "\nrequests (coordinator)\n  ";
  for (const auto& [label, value] : v.coordinator_counters.counters)
    out += fmt::format("{} {}  ", label, value);
  out += "\n\nrings\n";
  out += fmt::format("  {:<12} {:<5} {:>12} {:>12} {:>14} {:>14} {:>11} {:>8} {:>8} {:>7}  {}\n",
                     "name", "kind", "capacity", "used", "head", "tail", "full", "skipped",
                     "corrupt", "parked", "state");
  for (const RingView& r : v.rings) {
    const bool b = r.kind == "mpsc";
    out += fmt::format(
        "  {:<12} {:<5} {:>12} {:>12} {:>14} {:>14} {:>11} {:>8} {:>8} {:>7}  {}\n", r.name, r.kind,
        b ? bytes(r.capacity) : std::to_string(r.capacity),
        b ? bytes(r.used) : std::to_string(r.used), r.head, r.tail, r.full_events,
        r.skipped_records, r.corrupt_records + r.corrupt_events, r.parked_waiters,
        fmt::format("{}{}",
                    r.stalled_ms > 0 ? fmt::format("{} (blocked {:.0f} ms)", r.state, r.stalled_ms)
                                     : r.state,
                    r.reader_pid != 0 ? fmt::format("  read by pid {} (session {:08x})",
                                                    r.reader_pid, r.reader_session)
                                      : std::string()));
  }
  if (const RingView* submit = submit_ring_of(v)) out += engine_sessions_line(*submit);
  out += fmt::format(
      "\nbarrier  generation {}  parties {}  arrived {}  completed {}  poisoned {}  timeouts {}\n",
      v.barrier.generation, v.barrier.parties, v.barrier.arrived, v.barrier.rounds_completed,
      v.barrier.rounds_poisoned, v.barrier.timeouts);
  out += fmt::format("woken    coordinator {}", v.coordinator_doorbell_wakes);
  for (const WorkerView& w : v.workers)
    out += fmt::format("  rank {} {}", w.rank, w.doorbell_wakes);
  out += "\n";
  out += "\nlatency\n";
  histograms(out, "coordinator", v.coordinator_counters);
  histograms(out, "clients", v.client_counters);
  for (const WorkerView& w : v.workers)
    histograms(out, fmt::format("rank {}", w.rank), w.counters);
  return out;
}

namespace {

nlohmann::json counters_json(const CountersView& c) {
  nlohmann::json counters = nlohmann::json::object();
  for (const auto& [label, value] : c.counters)
    counters[label] = value;
  nlohmann::json hist = nlohmann::json::object();
  for (const auto& [label, h] : c.histograms)
    hist[label] = {{"unit", h.unit}, {"count", h.count}, {"p50", h.p50}, {"p90", h.p90},
                   {"p99", h.p99},   {"p99.9", h.p999},  {"max", h.max}};
  return {{"counters", counters}, {"histograms", hist}};
}

nlohmann::json process_json(const ProcessView& p) {
  return {{"pid", p.pid},
          {"state", p.state},
          {"health", p.health},
          {"heartbeat_age_ms", p.heartbeat_age_ms},
          {"registrations", p.registrations}};
}

}  // namespace

nlohmann::json render_json(const InstanceView& v) {
  const InstanceConfig& c = v.config;
  nlohmann::json j;
  j["schema"] = "kvrelay-dump/1";
  j["health"] = v.health;
  j["problems"] = v.problems;
  j["instance"] = {{"name", v.name},
                   {"layout_version", v.layout_version},
                   {"epoch", v.epoch},
                   {"state", v.state},
                   {"stale", v.stale},
                   {"stale_reason", v.stale_reason},
                   {"segment_bytes", v.segment_bytes}};
  j["coordinator"] = process_json(v.coordinator);
  j["coordinator"].update(counters_json(v.coordinator_counters));
  j["coordinator"]["doorbell_wakes"] = v.coordinator_doorbell_wakes;
  j["clients"] = counters_json(v.client_counters);
  j["config"] = {{"tp_size", c.tp_size},
                 {"role", role_name(static_cast<Role>(c.role))},
                 {"num_layers", c.num_layers},
                 {"extra_layers", c.extra_layers},
                 {"num_blocks", c.num_blocks},
                 {"extra_layer_blocks", c.extra_layer_blocks},
                 {"block_size", c.block_size},
                 {"kv_heads", c.kv_heads},
                 {"total_kv_heads", head_layout_of(c).total_heads},
                 {"head_dim", c.head_dim},
                 {"dtype", dtype_name(static_cast<CacheDtype>(c.dtype))},
                 {"has_scales", c.has_scales != 0},
                 {"k_only", c.k_only != 0},
                 {"pool", c.engine_pools != 0 ? "none" : "host"},
                 {"host_blocks", c.host_blocks},
                 {"request_deadline_ms", c.request_deadline_ms},
                 {"peer_timeout_ms", c.peer_timeout_ms},
                 {"stall_timeout_ms", c.stall_timeout_ms},
                 {"stall_report_ms", c.stall_report_ms}};
  j["workers"] = nlohmann::json::array();
  for (const WorkerView& w : v.workers) {
    nlohmann::json wj = process_json(w.process);
    wj["rank"] = w.rank;
    wj["ready"] = w.ready;
    wj["exit_reason"] = w.exit_reason;
    wj["pools"] = nlohmann::json::array();
    for (const PoolEntryView& p : w.pools)
      wj["pools"].push_back({{"tier", p.tier},
                             {"location", p.location},
                             {"name", p.name},
                             {"bytes", p.bytes},
                             {"device_id", p.device_id}});
    wj["device_signal_word"] = w.device_signal_word;
    wj["doorbell_wakes"] = w.doorbell_wakes;
    wj["stalled"] = w.stalled;
    wj["stalls"] = nlohmann::json::array();
    for (const StallView& s : w.stalls)
      wj["stalls"].push_back({{"request_id", s.request_id},
                              {"slot", s.slot},
                              {"reason", s.reason},
                              {"seconds", s.seconds},
                              {"transfers_in_flight", s.in_flight},
                              {"peer", s.peer}});
    wj.update(counters_json(w.counters));
    j["workers"].push_back(wj);
  }
  j["rings"] = nlohmann::json::array();
  for (const RingView& r : v.rings)
    j["rings"].push_back({{"name", r.name},
                          {"kind", r.kind},
                          {"capacity", r.capacity},
                          {"capacity_unit", r.kind == "mpsc" ? "bytes" : "records"},
                          {"used", r.used},
                          {"head", r.head},
                          {"tail", r.tail},
                          {"full_events", r.full_events},
                          {"skipped_records", r.skipped_records},
                          {"corrupt_records", r.corrupt_records},
                          {"corrupt_events", r.corrupt_events},
                          {"state", r.state},
                          {"stalled_ms", r.stalled_ms},
                          {"reader_pid", r.reader_pid},
                          {"reader_session", r.reader_session},
                          {"producer_pids", r.producer_pids},
                          {"producer_slots", r.producer_slots},
                          {"parked_waiters", r.parked_waiters}});
  j["barrier"] = {{"generation", v.barrier.generation},
                  {"parties", v.barrier.parties},
                  {"arrived", v.barrier.arrived},
                  {"rounds_completed", v.barrier.rounds_completed},
                  {"rounds_poisoned", v.barrier.rounds_poisoned},
                  {"timeouts", v.barrier.timeouts}};
  return j;
}

}  // namespace kvrelay::dump
