// kvrelay-sim: drives a prefill instance and a decode instance like an
// inference engine, with a verifiable KV pattern, and prints a summary.
// With --start it starts both instances itself (and stops them at the end).
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <map>
#include <optional>

#include "instances.h"
#include "kvrelay/client.h"
#include "shm/command_line.h"
#include "simulator.h"
#include "swap_scenario.h"
#include "two_hosts.h"

using namespace kvrelay;

int main(int argc, char** argv) {
  sim::SimOptions o;
  sim::Geometry g;
  std::string prefill = "sim-prefill", decode = "sim-decode", log_dir, log_level = "warn";
  bool start = false, swap = false;
  sim::SwapOptions swap_options;
  CLI::App app{
      "kvrelay-sim: an engine simulator that moves verifiable KV blocks from a prefill "
      "instance to a decode instance and checks every byte"};
  app.add_flag("--start", start,
               "start both instances (kvrelay-coordinator) and stop them at the end");
  app.add_flag(
      "--swap", swap,
      "the transfer manager's scenario instead: evict to the host tier, then load layer by layer "
      "while a simulated forward waits on each layer (one instance, --prefill, with a host tier)");
  app.add_option("--prefill", prefill, "prefill instance name")->capture_default_str();
  app.add_option("--decode", decode, "decode instance name")->capture_default_str();
  app.add_option("--tp", g.tp, "with --start: tensor-parallel ranks")->capture_default_str();
  app.add_option("--layers", g.layers, "with --start: model layers")->capture_default_str();
  app.add_option("--extra-layers", g.extra_layers, "with --start: speculative extra layers")
      ->capture_default_str();
  app.add_option("--blocks", g.blocks, "with --start: blocks per rank")->capture_default_str();
  app.add_option("--block-size", g.block_size, "with --start: tokens per block")
      ->capture_default_str();
  app.add_option("--kv-heads", g.kv_heads, "with --start: KV heads per rank")
      ->capture_default_str();
  app.add_option("--head-dim", g.head_dim, "with --start: head dimension")->capture_default_str();
  app.add_option("--dtype", g.dtype, "with --start: bfloat16, float16, uint8 or fp8 (with scales)")
      ->capture_default_str();
  app.add_option("--log-dir", log_dir, "with --start: where the instances write their logs");
  app.add_option("--log-level", log_level, "with --start: the instances' log level")
      ->capture_default_str();
  app.add_flag("--trace", o.trace, "print each request's submit / prefilled / completion times");
  app.add_option("--requests", o.requests, "requests to move")->capture_default_str();
  app.add_option("--batch", o.batch, "slots prefilling in each step")->capture_default_str();
  app.add_option("--chunk-tokens", o.chunk_tokens,
                 "chunked prefill: tokens per request per step (0: whole prompt)")
      ->capture_default_str();
  app.add_option("--min-tokens", o.min_tokens, "shortest prompt")->capture_default_str();
  app.add_option("--max-tokens", o.max_tokens, "longest prompt")->capture_default_str();
  o.layer_compute_us = 1000;
  app.add_option("--layer-compute-us", o.layer_compute_us, "simulated compute time of one layer")
      ->capture_default_str();
  app.add_option("--prefix-hit-rate", o.prefix_hit_rate,
                 "fraction of requests whose decode side holds a prefix")
      ->capture_default_str();
  app.add_option("--late-dest-rate", o.late_dest_rate,
                 "fraction of decode halves sent after prefill finished")
      ->capture_default_str();
  app.add_flag("--legacy", o.legacy, "the original's per-query mode: (step, layer) signals");
  app.add_flag("--send-after-prefill", o.send_after_prefill,
               "baseline: push every layer's signal only after the step's last layer")
      ->excludes("--legacy");
  app.add_option("--kill-every-ms", o.kill_every_ms,
                 "soak: SIGKILL a random worker this often (requests on its rank fail, naming it)");
  app.add_option("--min-finished", o.min_finished,
                 "soak: fail unless at least this many requests finish despite the kills")
      ->needs("--kill-every-ms");
  app.add_option("--seed", o.seed, "random seed")->capture_default_str();
  const std::map<std::string, sim::SimOptions::Fault> faults{
      {"none", sim::SimOptions::Fault::kNone},
      {"stray", sim::SimOptions::Fault::kStray},
      {"corrupt", sim::SimOptions::Fault::kCorrupt}};
  std::string fault = "none";
  app.add_option("--inject-fault", fault,
                 "test the simulator's own checks: 'stray' writes a word into a free decode "
                 "block just before a request takes it, 'corrupt' alters a word the first "
                 "finished request received; the run must then fail, naming the block")
      ->check(CLI::IsMember(faults))
      ->capture_default_str();
  std::string protocol = "ipc", auth_key_file;
  app.add_option("--protocol", protocol,
                 "ipc (same host), tcp (to the decode instance's --tcp-ports) or rdma (to "
                 "its --rdma-ports, over the first RDMA device)")
      ->check(CLI::IsMember({"ipc", "tcp", "rdma"}))
      ->capture_default_str();
  app.add_option("--peer-address", o.peer_address,
                 "tcp, rdma: the decode instance's listen address")
      ->capture_default_str();
  app.add_option("--auth-key-file", auth_key_file,
                 "tcp, rdma with --start: the instances' key (default: a fresh temporary one)");
  std::string rdma_gid_index = "1";
  app.add_option("--rdma-gid-index", rdma_gid_index,
                 "rdma with --start: the instances' RoCE GID index")
      ->capture_default_str();
  uint32_t decode_tp = 0, total_kv_heads = 0;
  app.add_option("--decode-tp", decode_tp,
                 "with --start: the decode instance's TP size (0: --tp); another size than "
                 "--tp is heterogeneous TP, verified head by head on every decode rank")
      ->capture_default_str();
  app.add_option("--total-kv-heads", total_kv_heads,
                 "with --start: the model's KV heads (0: --kv-heads x --tp); fewer than a TP "
                 "size replicate heads over that instance's ranks")
      ->capture_default_str();
  app.add_flag("--k-only", g.k_only,
               "with --start: pools without V (one tensor per layer, plus its scale with fp8)");
  bool mla = false;
  app.add_flag("--mla", mla,
               "with --start: a DeepSeek-style MLA latent cache: --k-only, one KV head in all "
               "(--total-kv-heads 1, replicated on every rank of both instances), and "
               "--head-dim 576 (512 latent + 64 RoPE values) unless given");
  uint32_t peer_timeout_ms = 0;
  app.add_option("--peer-timeout-ms", peer_timeout_ms,
                 "with --start: the instances' --peer-timeout-ms (0: their default); raise it "
                 "where the machine is emulated or starved, so that slowness is not taken for "
                 "a dead peer");
  std::string idle_strategy;
  app.add_option("--idle-strategy", idle_strategy,
                 "with --start: the instances' --idle-strategy (default: theirs, park)")
      ->check(CLI::IsMember({"park", "backoff", "spin"}));
  std::optional<int64_t> wake_slice_us;
  app.add_option("--wake-slice-us", wake_slice_us,
                 "with --start: the coordinators' --wake-slice-us (default: theirs, 100; 0: the "
                 "kernel's default slice)")
      ->check(CLI::Range(int64_t{0}, int64_t{100'000}));
  int64_t timeout_s = o.timeout.count();
  app.add_flag("--expect-arrivals", o.expect_arrivals,
               "the decode engine declares every request to its instance first (ExpectSpec) and "
               "must get exactly one `arrived` completion per request");
  app.add_option("--timeout-s", timeout_s, "give up after this long")->capture_default_str();
  kvrelay::add_version_flag(app, "kvrelay-sim");
  KVRELAY_PARSE_COMMAND_LINE(app, argc, argv);
  o.timeout = std::chrono::seconds(timeout_s);
  if (mla) {
    g.k_only = true;
    if (total_kv_heads != 0 && total_kv_heads != 1) {
      fmt::print(stderr, "kvrelay-sim: --mla has one KV head in all, not --total-kv-heads {}\n",
                 total_kv_heads);
      return 2;
    }
    total_kv_heads = 1;
    g.kv_heads = 1;
    if (app.count("--head-dim") == 0) g.head_dim = 576;
  }
  if (swap) {
    g.host_blocks = 2 * g.blocks;
    swap_options.rounds = o.requests;
    swap_options.seed = o.seed;
    sim::ManagedInstance instance;
    if (start) {
      fmt::print(
          "starting instance '{}' (mixed, tp {}, {} layers, {} device blocks, {} host blocks)\n",
          prefill, g.tp, g.layers + g.extra_layers, g.blocks, g.host_blocks);
      if (Status s = instance.start(prefill, "mixed", g, log_dir, log_level); !s) {
        fmt::print(stderr, "kvrelay-sim: {}\n", s.error().message);
        return 2;
      }
    }
    auto client = Client::attach(prefill, Deadline::after(std::chrono::seconds(60)));
    if (!client) {
      fmt::print(stderr, "kvrelay-sim: {}\n", client.error().message);
      return 2;
    }
    const sim::SwapReportSummary r = sim::run_swap_scenario(swap_options, *client);
    fmt::print("\n{}", r.summary());
    client = make_error(Errc::kOk, "");
    if (start && instance.stop() != 0) return 1;
    return r.ok() ? 0 : 1;
  }
  o.progress = isatty(2) != 0;
  o.tcp = protocol == "tcp";
  o.rdma = protocol == "rdma";
  o.inject_fault = faults.at(fault);

  // Heterogeneous TP: both instances serve the same model heads, spread
  // over their own ranks (replicated where a side has more ranks than heads).
  sim::Geometry decode_g = g;
  std::vector<std::string> hetero_flags;
  if (start && (decode_tp != 0 || total_kv_heads != 0)) {
    const uint32_t heads = total_kv_heads != 0 ? total_kv_heads : g.kv_heads * g.tp;
    decode_g.tp = decode_tp != 0 ? decode_tp : g.tp;
    g.kv_heads = std::max(1u, heads / g.tp);
    decode_g.kv_heads = std::max(1u, heads / decode_g.tp);
    hetero_flags = {"--total-kv-heads", std::to_string(heads)};
  }

  // With tcp or rdma, --start gives the decode instance a listener per rank
  // and both instances one key.
  sim::TemporaryKey temporary_key;
  std::vector<std::string> decode_flags, prefill_flags;
  if (start && (o.tcp || o.rdma)) {
    if (auth_key_file.empty()) auth_key_file = temporary_key.path();
    const std::vector<uint16_t> ports = sim::free_tcp_ports(decode_g.tp, o.peer_address);
    if (auth_key_file.empty() || ports.size() != decode_g.tp) {
      fmt::print(stderr, "kvrelay-sim: cannot make a key file or find {} free ports\n",
                 decode_g.tp);
      return 2;
    }
    std::string list;
    for (uint16_t p : ports)
      list += (list.empty() ? "" : ",") + std::to_string(p);
    const std::string protocols = o.rdma ? "ipc,rdma" : "ipc,tcp";
    decode_flags = {"--protocol",      protocols,     o.rdma ? "--rdma-ports" : "--tcp-ports",
                    list,              "--auth-key-file", auth_key_file,
                    "--listen-address", o.peer_address};
    prefill_flags = {"--protocol", protocols, "--auth-key-file", auth_key_file};
    if (o.rdma) {
      for (auto* flags : {&decode_flags, &prefill_flags})
        flags->insert(flags->end(), {"--rdma-gid-index", rdma_gid_index});
    }
  }

  for (auto* flags : {&decode_flags, &prefill_flags})
    flags->insert(flags->end(), hetero_flags.begin(), hetero_flags.end());
  if (start && peer_timeout_ms != 0) {
    for (auto* flags : {&decode_flags, &prefill_flags})
      flags->insert(flags->end(), {"--peer-timeout-ms", std::to_string(peer_timeout_ms)});
  }
  if (start && !idle_strategy.empty()) {
    for (auto* flags : {&decode_flags, &prefill_flags})
      flags->insert(flags->end(), {"--idle-strategy", idle_strategy});
  }
  if (start && wake_slice_us) {
    for (auto* flags : {&decode_flags, &prefill_flags})
      flags->insert(flags->end(), {"--wake-slice-us", std::to_string(*wake_slice_us)});
  }

  sim::ManagedInstance decode_instance, prefill_instance;
  if (start) {
    fmt::print(
        "starting instances '{}' (decode) and '{}' (prefill): tp {}, {} layers, {} blocks of {} "
        "tokens\n",
        decode, prefill,
        decode_g.tp == g.tp ? fmt::format("{}", g.tp)
                            : fmt::format("{} -> {} ({} and {} KV heads per rank)", g.tp,
                                          decode_g.tp, g.kv_heads, decode_g.kv_heads),
        g.layers + g.extra_layers, g.blocks, g.block_size);
    if (Status s =
            decode_instance.start(decode, "decode", decode_g, log_dir, log_level, decode_flags);
        !s) {
      fmt::print(stderr, "kvrelay-sim: {}\n", s.error().message);
      return 2;
    }
    if (Status s = prefill_instance.start(prefill, "prefill", g, log_dir, log_level, prefill_flags);
        !s) {
      fmt::print(stderr, "kvrelay-sim: {}\n", s.error().message);
      return 2;
    }
  }
  auto decode_client = Client::attach(decode, Deadline::after(std::chrono::seconds(60)));
  auto prefill_client = Client::attach(prefill, Deadline::after(std::chrono::seconds(60)));
  if (!decode_client || !prefill_client) {
    fmt::print(stderr, "kvrelay-sim: {}\n",
               !decode_client ? decode_client.error().message : prefill_client.error().message);
    return 2;
  }
  fmt::print(
      "simulating {} requests: batch {}, chunk {} tokens, prompts {}..{} tokens, {} us per layer, "
      "{:.0f}% prefix hits, {:.0f}% late decode halves{}, over {}\n",
      o.requests, o.batch, o.chunk_tokens, o.min_tokens, o.max_tokens, o.layer_compute_us,
      o.prefix_hit_rate * 100, o.late_dest_rate * 100, o.legacy ? ", legacy per-query mode" : "",
      protocol);
  const sim::SimReport report =
      sim::run_simulation(o, *prefill_client, *decode_client, prefill, decode);
  fmt::print("\n{}", report.summary());
  prefill_client = make_error(Errc::kOk, "");
  decode_client = make_error(Errc::kOk, "");
  if (start) {
    const int p = prefill_instance.stop();
    const int d = decode_instance.stop();
    if (p != 0 || d != 0) {
      fmt::print(stderr, "kvrelay-sim: the instances exited with {} and {}\n", p, d);
      return 1;
    }
  }
  return report.ok() ? 0 : 1;
}
