#include "instance/instance_config.h"

#include <fmt/format.h>

#include <cstring>

#include "instance/head_layout.h"
#include "instance/names.h"
#include "shm/bits.h"
#include "shm/mpsc_ring.h"

namespace kvrelay {

const char* role_name(Role r) {
  switch (r) {
    case Role::kMixed: return "mixed";
    case Role::kPrefill: return "prefill";
    case Role::kDecode: return "decode";
  }
  return "invalid";
}

const char* dtype_name(CacheDtype d) {
  switch (d) {
    case CacheDtype::kBf16: return "bfloat16";
    case CacheDtype::kFp16: return "float16";
    case CacheDtype::kUint8: return "uint8";
    case CacheDtype::kFp8: return "fp8";
  }
  return "invalid";
}

InstanceConfig default_config(std::string_view instance, uint32_t tp_size) {
  InstanceConfig c{};
  std::memcpy(c.instance, instance.data(), std::min(instance.size(), sizeof(c.instance) - 1));
  c.role = static_cast<uint32_t>(Role::kMixed);
  c.tp_size = tp_size;
  c.num_layers = 32;
  c.num_blocks = 1024;
  c.block_size = 64;
  c.kv_heads = 1;
  c.head_dim = 128;
  c.dtype = static_cast<uint32_t>(CacheDtype::kBf16);
  c.protocols = kProtocolIpc;
  c.submit_ring_bytes = 1U << 20;
  c.completion_ring_bytes = 1U << 20;
  c.task_ring_bytes = 1U << 20;
  c.signal_ring_records = 4096;
  c.signal_record_bytes = kSignalRecordBytes;
  c.report_ring_records = 1024;
  c.report_record_bytes = kReportRecordBytes;
  c.request_deadline_ms = 60'000;
  c.heartbeat_interval_ms = 100;
  c.peer_timeout_ms = 1000;
  c.stall_timeout_ms = 1000;
  c.stall_report_ms = 10'000;
  return c;
}

std::string instance_of(const InstanceConfig& config) {
  const char* end =
      static_cast<const char*>(std::memchr(config.instance, 0, sizeof(config.instance)));
  return std::string(config.instance,
                     end != nullptr ? end : config.instance + sizeof(config.instance));
}

namespace {

Status out_of_range(std::string_view field, uint64_t value, std::string_view limit) {
  return make_error(Errc::kInvalidArgument,
                    fmt::format("config {} = {} is out of range: {}", field, value, limit));
}

}  // namespace

Status validate_config(const InstanceConfig& c) {
  if (std::memchr(c.instance, 0, sizeof(c.instance)) == nullptr)
    return make_error(Errc::kInvalidArgument, "config instance name is not NUL-terminated");
  if (Status s = validate_instance_name(instance_of(c)); !s) return s;
  if (c.role > static_cast<uint32_t>(Role::kDecode))
    return out_of_range("role", c.role, "must be 0 (mixed), 1 (prefill) or 2 (decode)");
  if (c.tp_size < 1 || c.tp_size > kMaxTpSize)
    return out_of_range("tp_size", c.tp_size, fmt::format("must be in [1, {}]", kMaxTpSize));
  if (c.num_layers < 1 || c.num_layers > 1024)
    return out_of_range("num_layers", c.num_layers, "must be in [1, 1024]");
  if (c.extra_layers > 64) return out_of_range("extra_layers", c.extra_layers, "must be <= 64");
  if (c.num_blocks < 1 || c.num_blocks > (1U << 24))
    return out_of_range("num_blocks", c.num_blocks, "must be in [1, 16777216]");
  if (c.extra_layers > 0 && (c.extra_layer_blocks < 1 || c.extra_layer_blocks > (1U << 24)))
    return out_of_range("extra_layer_blocks", c.extra_layer_blocks,
                        "must be in [1, 16777216] when extra_layers > 0");
  if (c.block_size < 1 || c.block_size > 4096)
    return out_of_range("block_size", c.block_size, "must be in [1, 4096] tokens");
  if (c.kv_heads < 1 || c.kv_heads > 1024)
    return out_of_range("kv_heads", c.kv_heads, "must be in [1, 1024]");
  if (c.total_kv_heads != 0) {
    if (Status s = head_layout_of(c).check(); !s)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("total_kv_heads {}: {}", c.total_kv_heads, s.error().message));
  }
  if (c.head_dim < 1 || c.head_dim > 4096)
    return out_of_range("head_dim", c.head_dim, "must be in [1, 4096]");
  if (c.dtype > static_cast<uint32_t>(CacheDtype::kFp8))
    return out_of_range("dtype", c.dtype, "must be 0 (bf16), 1 (fp16), 2 (uint8) or 3 (fp8)");
  if (c.has_scales > 1) return out_of_range("has_scales", c.has_scales, "must be 0 or 1");
  if (c.protocols == 0 || c.protocols > (kProtocolIpc | kProtocolTcp | kProtocolRdma))
    return out_of_range("protocols", c.protocols,
                        "must be a non-empty set of ipc (1), tcp (2), rdma (4)");
  if (c.k_only > 1) return out_of_range("k_only", c.k_only, "must be 0 or 1");
  if (c.engine_pools > 1) return out_of_range("engine_pools", c.engine_pools, "must be 0 or 1");
  if (c.host_blocks > (1U << 24))
    return out_of_range("host_blocks", c.host_blocks, "must be in [0, 16777216]");
  if (c.group_access > 1) return out_of_range("group_access", c.group_access, "must be 0 or 1");

  const struct {
    const char* name;
    uint32_t value;
  } byte_rings[] = {{"submit_ring_bytes", c.submit_ring_bytes},
                    {"completion_ring_bytes", c.completion_ring_bytes},
                    {"task_ring_bytes", c.task_ring_bytes}};
  for (const auto& r : byte_rings) {
    if (!is_pow2(r.value) || r.value < 4096 || r.value > MpscRing::kMaxCapacity)
      return out_of_range(
          r.name, r.value,
          fmt::format("must be a power of two in [4096, {}]", MpscRing::kMaxCapacity));
  }
  // Every completion must fit one record (its texts are capped to fit).
  if (c.completion_ring_bytes < kMinCompletionRingBytes)
    return out_of_range("completion_ring_bytes", c.completion_ring_bytes,
                        fmt::format("must be at least {}", kMinCompletionRingBytes));
  const struct {
    const char* name;
    uint32_t records;
    uint32_t record_bytes;
  } fixed_rings[] = {{"signal_ring", c.signal_ring_records, c.signal_record_bytes},
                     {"report_ring", c.report_ring_records, c.report_record_bytes}};
  for (const auto& r : fixed_rings) {
    if (!is_pow2(r.records) || r.records < 2 || r.records > (1U << 24))
      return out_of_range(fmt::format("{}_records", r.name), r.records,
                          "must be a power of two in [2, 16777216]");
    if (r.record_bytes < 8 || r.record_bytes > 4096 || r.record_bytes % 8 != 0)
      return out_of_range(fmt::format("{}_record_bytes", r.name), r.record_bytes,
                          "must be a multiple of 8 in [8, 4096]");
  }
  if (c.request_deadline_ms < 1)
    return out_of_range("request_deadline_ms", c.request_deadline_ms, "must be >= 1");
  if (c.heartbeat_interval_ms < 1 || c.heartbeat_interval_ms > 10'000)
    return out_of_range("heartbeat_interval_ms", c.heartbeat_interval_ms, "must be in [1, 10000]");
  if (c.peer_timeout_ms <= c.heartbeat_interval_ms)
    return out_of_range("peer_timeout_ms", c.peer_timeout_ms, "must exceed heartbeat_interval_ms");
  if (c.stall_timeout_ms < 1)
    return out_of_range("stall_timeout_ms", c.stall_timeout_ms, "must be >= 1");
  if (c.stall_report_ms < 1)
    return out_of_range("stall_report_ms", c.stall_report_ms, "must be >= 1");
  return {};
}

}  // namespace kvrelay
