#include "coordinator/options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/statvfs.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sstream>

#include "instance/names.h"
#include "instance/pool_geometry.h"
#include "instance/pool_segment.h"
#include "shm/command_line.h"
#include "shm/cpu_affinity.h"
#include "worker/transport_options.h"

namespace kvrelay::coordinator {

namespace {

Result<CacheDtype> parse_dtype(const std::string& s) {
  if (s == "bfloat16" || s == "bf16") return CacheDtype::kBf16;
  if (s == "float16" || s == "fp16") return CacheDtype::kFp16;
  if (s == "uint8") return CacheDtype::kUint8;
  if (s == "fp8" || s == "float8_e4m3fn" || s == "block_wise_fp8") return CacheDtype::kFp8;
  return make_error(Errc::kInvalidArgument,
                    fmt::format("--dtype '{}' is not one of bfloat16, float16, uint8, fp8", s));
}

Result<Role> parse_role(const std::string& s) {
  if (s == "prefill") return Role::kPrefill;
  if (s == "decode") return Role::kDecode;
  if (s == "mixed") return Role::kMixed;
  return make_error(Errc::kInvalidArgument,
                    fmt::format("--role '{}' is not one of prefill, decode, mixed", s));
}

Result<uint32_t> parse_protocols(const std::string& s) {
  uint32_t mask = 0;
  std::stringstream in(s);
  std::string p;
  while (std::getline(in, p, ',')) {
    if (p == "ipc") {
      mask |= kProtocolIpc;
    } else if (p == "tcp") {
      mask |= kProtocolTcp;
    } else if (p == "rdma") {
      mask |= kProtocolRdma;
    } else {
      return make_error(Errc::kInvalidArgument,
                        fmt::format("--protocol '{}' is not one of ipc, tcp, rdma", p));
    }
  }
  if (mask == 0) return make_error(Errc::kInvalidArgument, "--protocol is empty");
  return mask;
}

Status parse_ports(const std::string& s, uint32_t tp, uint16_t* out, const char* flag) {
  if (s.empty()) return {};
  std::vector<uint16_t> ports;
  std::stringstream in(s);
  std::string p;
  while (std::getline(in, p, ',')) {
    try {
      const long v = std::stol(p);
      if (v <= 0 || v > 65535) throw std::out_of_range(p);
      ports.push_back(static_cast<uint16_t>(v));
    } catch (...) {
      return make_error(Errc::kInvalidArgument,
                        fmt::format("{} has '{}', which is not a port", flag, p));
    }
  }
  if (ports.size() != tp)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("{} lists {} ports but --tp-size is {}: one port per rank", flag,
                                  ports.size(), tp));
  std::copy(ports.begin(), ports.end(), out);
  return {};
}

// The original's --speculative_config JSON: num_extra_cache_layer and
// num_gpu_block_expand_ratio.
Status apply_speculative(const std::string& json, InstanceConfig& c) {
  if (json.empty() || json == "{}") return {};
  try {
    const auto j = nlohmann::json::parse(json);
    if (!j.is_object()) throw std::invalid_argument("not an object");
    c.extra_layers = j.value("num_extra_cache_layer", 0U);
    const double ratio = j.value("num_gpu_block_expand_ratio", 1.0);
    if (ratio <= 0 || ratio > 16)
      throw std::invalid_argument("num_gpu_block_expand_ratio out of (0, 16]");
    c.extra_layer_blocks = static_cast<uint32_t>(c.num_blocks * ratio);
  } catch (const std::exception& e) {
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("--speculative-config is not valid JSON of the original's form "
                    "({{\"num_extra_cache_layer\": N, \"num_gpu_block_expand_ratio\": "
                    "R}}): {}",
                    e.what()));
  }
  return {};
}

}  // namespace

uint64_t pool_bytes_per_rank(const InstanceConfig& c) {
  uint64_t bytes = 0;
  if (c.engine_pools == 0) bytes += HostPool::segment_bytes(pool_geometry_of(c, PoolTier::kDevice));
  if (c.host_blocks > 0) bytes += HostPool::segment_bytes(pool_geometry_of(c, PoolTier::kHost));
  return bytes;
}

Result<CoordinatorOptions> parse_options(int argc, char** argv) {
  CoordinatorOptions o;
  std::string instance, role = "mixed", dtype = "bfloat16", protocol = "ipc", rdma_ports, tcp_ports,
                        speculative;
  InstanceConfig d = default_config("x", 1);
  uint32_t tp = 1;
  int64_t startup_ms = o.startup_timeout.count(), drain_ms = o.drain_timeout.count();
  bool fp8_scales = true;

  CLI::App app{
      "kvrelay-coordinator: owns an instance's shared-memory rings, starts and supervises one "
      "kvrelay-worker per tensor-parallel rank, and answers every request with exactly one "
      "completion."};
  app.add_option("--instance", instance, "instance name, [A-Za-z0-9._-]{1,64}")->required();
  app.add_option("--role", role, "prefill, decode or mixed (original: --splitwise_role)")
      ->capture_default_str();
  app.add_option("--tp-size", tp, "tensor-parallel ranks = worker processes (original: --mp_num)")
      ->capture_default_str();
  app.add_option("--num-layers", d.num_layers, "model layers (original: --num_layers)")
      ->capture_default_str();
  app.add_option("--block-size", d.block_size, "tokens per KV block (original: --block_size)")
      ->capture_default_str();
  app.add_option("--kv-heads", d.kv_heads, "KV heads per rank (original: --kv_num_head)")
      ->capture_default_str();
  app.add_option("--total-kv-heads", d.total_kv_heads,
                 "the model's KV heads over all ranks (0: kv-heads x tp-size). Below tp-size, "
                 "heads are replicated over ranks (GQA): kv-heads must be 1. A decode instance "
                 "of another tp-size accepts blocks when the totals match (docs/transports.md: "
                 "Heterogeneous TP)")
      ->capture_default_str();
  app.add_option("--head-dim", d.head_dim, "head dimension (original: --head_dim)")
      ->capture_default_str();
  app.add_option("--dtype", dtype, "bfloat16, float16, uint8 or fp8 (original: --cache_dtype)")
      ->capture_default_str();
  app.add_flag("--fp8-scales,!--no-fp8-scales", fp8_scales,
               "fp8 caches carry block-wise float32 scales (default on)");
  app.add_option("--num-blocks", d.num_blocks,
                 "KV blocks per rank in the device pool (original: --num_gpu_blocks)")
      ->capture_default_str();
  app.add_option("--num-host-blocks", d.host_blocks,
                 "blocks per rank in the host tier for swap tasks; 0: none (original transfer "
                 "manager: num_cpu_blocks)")
      ->capture_default_str();
  bool k_only = false;
  app.add_flag("--k-only", k_only,
               "the cache has no V: one tensor per layer (plus its scale). For multi-head latent "
               "attention (DeepSeek-style MLA), with --total-kv-heads 1 (every rank holds the "
               "whole latent) and --head-dim the latent's values per token, or --dtype uint8 "
               "with --head-dim the bytes per token for an opaque format such as FlashMLA's fp8 "
               "(656)");
  std::string pool = "host";
  app.add_option("--pool", pool,
                 "where each rank's KV pool lives: host (the worker makes one in /dev/shm, the "
                 "size of the cache: for CPU engines and demos) or none (the engine registers "
                 "its own, e.g. its GPU cache, and the worker serves no transfer until it has)")
      ->check(CLI::IsMember({"host", "none"}))
      ->capture_default_str();
  app.add_option(
         "--protocol", protocol,
         "accepted transfer protocols, comma-separated: ipc,tcp,rdma (original: --protocol)")
      ->capture_default_str();
  app.add_option("--rdma-ports", rdma_ports,
                 "per-rank RDMA handshake ports, comma-separated (original: --rdma_port)");
  app.add_option("--tcp-ports", tcp_ports, "per-rank TCP transport ports, comma-separated");
  // The data plane's and the network transports' flags: declared by their
  // owners, once for both programs, and handed on to every worker.
  worker::NetworkOptions network;
  worker::declare_transport_options(app, network);
  app.add_option(
      "--speculative-config", speculative,
      "the original's JSON: {\"num_extra_cache_layer\": N, \"num_gpu_block_expand_ratio\": R} "
      "(original: --speculative_config)");
  app.add_option("--extra-layers", d.extra_layers,
                 "speculative extra cache layers (overrides the JSON)");
  app.add_option("--extra-layer-blocks", d.extra_layer_blocks, "blocks in each extra layer");
  app.add_option("--request-deadline-ms", d.request_deadline_ms, "default per-request deadline")
      ->capture_default_str();
  app.add_option("--peer-timeout-ms", d.peer_timeout_ms,
                 "heartbeat age after which a process is presumed dead")
      ->capture_default_str();
  app.add_option("--stall-report-ms", d.stall_report_ms,
                 "a request not finished this long after its final chunk was signalled on a rank "
                 "is logged and listed by kvrelay-dump (the deadline still ends it)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--submit-ring-bytes", d.submit_ring_bytes,
                 "engine -> coordinator ring size (power of two)")
      ->capture_default_str();
  app.add_option("--completion-ring-bytes", d.completion_ring_bytes,
                 "coordinator -> engine ring size")
      ->capture_default_str();
  app.add_option("--task-ring-bytes", d.task_ring_bytes,
                 "coordinator -> worker ring size, per rank")
      ->capture_default_str();
  app.add_option("--signal-ring-records", d.signal_ring_records,
                 "engine -> worker layer-signal records, per rank")
      ->capture_default_str();
  app.add_flag(
      "--external-workers", o.external_workers,
      "do not start workers: wait for kvrelay-worker processes started by another supervisor");
  app.add_option("--worker-binary", o.worker_binary,
                 "kvrelay-worker to start (default: next to this binary)");
  app.add_option("--log-dir", o.log_dir,
                 "directory for kvrelay-coordinator.log and kvrelay-worker-rank<r>.log");
  app.add_option("--log-level", o.log_level, "trace, debug, info, warn, error, critical or off")
      ->capture_default_str();
  app.add_flag("--group-access", o.group_access,
               "create segments 0660 (group access) instead of 0600");
  app.add_option("--startup-timeout-ms", startup_ms, "how long the workers may take to line up")
      ->capture_default_str();
  app.add_option("--drain-timeout-ms", drain_ms,
                 "on SIGTERM/SIGINT, how long in-flight requests may finish")
      ->capture_default_str();
  std::string idle = "park", cpu_list;
  app.add_option("--idle-strategy", idle,
                 "how the coordinator and its workers wait: park (sleep, no CPU while idle), "
                 "backoff (spin, yield, then sleep) or spin (a whole CPU each, lowest latency; "
                 "for dedicated cores)")
      ->check(CLI::IsMember({"park", "backoff", "spin"}))
      ->capture_default_str();
  app.add_option("--cpu-list", cpu_list,
                 "pin the coordinator to the first CPU of this list and rank r's worker to "
                 "entry r + 1 (round robin), e.g. 2-5");

  int64_t wake_slice_us =
      std::chrono::duration_cast<std::chrono::microseconds>(o.wake_slice).count();
  app.add_option(
         "--wake-slice-us", wake_slice_us,
         "the coordinator's scheduler slice (Linux 6.12+, which clamps it to 100-100000 us; "
         "0: the kernel's default): a short one lets it preempt the copies when a report "
         "or a request wakes it; the workers keep the default")
      ->check(CLI::Range(int64_t{0}, int64_t{100'000}))
      ->capture_default_str();

  add_version_flag(app, "kvrelay-coordinator");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return make_error(Errc::kNotFound, app.help());
  } catch (const CLI::CallForVersion& e) {
    return make_error(Errc::kNotFound, e.what());  // printed like the help, exit 0
  } catch (const CLI::ParseError& e) {
    return make_error(Errc::kInvalidArgument,
                      fmt::format("{}\nRun with --help for the flags.", e.what()));
  }

  parse_idle_strategy(idle, o.idle);  // checked by CLI above
  o.wake_slice = std::chrono::microseconds(wake_slice_us);
  if (!cpu_list.empty()) {
    Result<std::vector<int>> cpus = parse_cpu_list(cpu_list);
    if (!cpus) return cpus.error();
    o.cpus = std::move(cpus).value();
    o.worker_args.insert(o.worker_args.end(), {"--cpu-list", cpu_list});
  }
  o.worker_args.insert(o.worker_args.end(), {"--idle-strategy", idle});
  if (Status s = validate_instance_name(instance); !s)
    return make_error(Errc::kInvalidArgument, "--instance: " + s.error().message);
  if (tp < 1 || tp > kMaxTpSize)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("--tp-size {} must be in [1, {}]", tp, kMaxTpSize));
  InstanceConfig c = default_config(instance, tp);
  const uint32_t extra_layers_flag = d.extra_layers, extra_blocks_flag = d.extra_layer_blocks;
  c.num_layers = d.num_layers;
  c.block_size = d.block_size;
  c.kv_heads = d.kv_heads;
  c.total_kv_heads = d.total_kv_heads;
  c.head_dim = d.head_dim;
  c.num_blocks = d.num_blocks;
  c.host_blocks = d.host_blocks;
  c.engine_pools = pool == "none" ? 1 : 0;
  c.k_only = k_only ? 1 : 0;
  c.request_deadline_ms = d.request_deadline_ms;
  c.peer_timeout_ms = d.peer_timeout_ms;
  c.stall_report_ms = d.stall_report_ms;
  c.submit_ring_bytes = d.submit_ring_bytes;
  c.completion_ring_bytes = d.completion_ring_bytes;
  c.task_ring_bytes = d.task_ring_bytes;
  c.signal_ring_records = d.signal_ring_records;
  c.group_access = o.group_access ? 1 : 0;
  Result<Role> r = parse_role(role);
  if (!r) return r.error();
  c.role = static_cast<uint32_t>(*r);
  Result<CacheDtype> dt = parse_dtype(dtype);
  if (!dt) return dt.error();
  c.dtype = static_cast<uint32_t>(*dt);
  c.has_scales = (*dt == CacheDtype::kFp8 && fp8_scales) ? 1 : 0;
  Result<uint32_t> p = parse_protocols(protocol);
  if (!p) return p.error();
  c.protocols = *p;
  if (Status s = parse_ports(rdma_ports, tp, c.rdma_ports, "--rdma-ports"); !s) return s.error();
  if (Status s = parse_ports(tcp_ports, tp, c.tcp_ports, "--tcp-ports"); !s) return s.error();
  if (Status s = worker::settle_transport_options(c, network); !s) return s.error();
  const std::vector<std::string> handed_on = worker::hand_on_transport_options(c, network);
  o.worker_args.insert(o.worker_args.end(), handed_on.begin(), handed_on.end());
  if (Status s = apply_speculative(speculative, c); !s) return s.error();
  if (extra_layers_flag != 0) c.extra_layers = extra_layers_flag;
  if (extra_blocks_flag != 0) c.extra_layer_blocks = extra_blocks_flag;
  if (c.extra_layers > 0 && c.extra_layer_blocks == 0) c.extra_layer_blocks = c.num_blocks;
  if (Status s = validate_config(c); !s)
    return make_error(Errc::kInvalidArgument, s.error().message);

  // An impossible geometry is one that does not fit where the pools live.
  const uint64_t per_rank = pool_bytes_per_rank(c);
  struct statvfs fs {};
  if (statvfs("/dev/shm", &fs) == 0) {
    const uint64_t avail = uint64_t{fs.f_bavail} * fs.f_frsize;
    if (per_rank * tp > avail) {
      std::vector<std::string> parts;
      if (c.engine_pools == 0)
        parts.push_back(fmt::format(
            "a device pool of {} layers x {} blocks of {} bytes per tensor", c.num_layers + c.extra_layers,
            c.num_blocks, pool_geometry_of(c, PoolTier::kDevice).block_bytes(PoolTensor::kKey)));
      if (c.host_blocks > 0)
        parts.push_back(fmt::format("a host swap tier of {} blocks", c.host_blocks));
      return make_error(
          Errc::kInvalidArgument,
          // MiB, rounded so that what is needed never reads as what is free.
          fmt::format("the pools need {} MiB ({} ranks x {} MiB: {}) but /dev/shm has {} MiB "
                      "free. {}Give /dev/shm more room (in a container: docker run "
                      "--shm-size, or a memory-backed emptyDir on /dev/shm)",
                      (per_rank * tp + (1 << 20) - 1) >> 20, tp, (per_rank + (1 << 20) - 1) >> 20,
                      fmt::join(parts, " and "), avail >> 20,
                      c.engine_pools == 0 ? "Where the engine registers its own KV cache (a GPU's), "
                                            "run with --pool none. "
                                          : ""));
    }
  }
  o.config = c;
  o.startup_timeout = std::chrono::milliseconds(startup_ms);
  o.drain_timeout = std::chrono::milliseconds(drain_ms);
  return o;
}

}  // namespace kvrelay::coordinator
