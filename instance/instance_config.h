// The configuration of a kvrelay instance, as stored in its control segment
// header. Every process that attaches reads it from there, so the geometry
// and ring sizes are decided once, by the coordinator, and can be inspected
// by kvrelay-dump.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvrelay/types.h"
#include "shm/result.h"

namespace kvrelay {

// Sizes of the fixed records on the signal and report rings
// (schemas/records.h asserts that its structs match).
inline constexpr uint32_t kSignalRecordBytes = 120;
inline constexpr uint32_t kReportRecordBytes = 1016;

inline constexpr uint32_t kMaxTpSize = 16;
// The smallest completion ring: its records (an eighth of it) hold any
// completion, whose texts are capped.
inline constexpr uint32_t kMinCompletionRingBytes = 16384;

// Plain data, fixed size: it lives in shared memory. Every numeric field is
// validated by validate_config() before a process trusts it.
struct InstanceConfig {
  char instance[72];  // NUL-terminated instance name

  uint32_t role;     // Role
  uint32_t tp_size;  // tensor-parallel ranks = worker processes

  // KV-cache geometry of one rank's pool (DESIGN.md section 6).
  uint32_t num_layers;
  uint32_t extra_layers;  // speculative-decoding extra cache layers
  uint32_t num_blocks;
  uint32_t extra_layer_blocks;  // blocks in each extra layer
  uint32_t block_size;          // tokens per block
  uint32_t kv_heads;            // per rank
  uint32_t head_dim;
  uint32_t dtype;         // CacheDtype
  uint32_t has_scales;    // 1: fp8 block-wise scales travel with K/V
  uint32_t host_blocks;   // blocks in the host (offload) tier of swap tasks; 0: none
  uint32_t protocols;     // transfer protocols this instance accepts: bit 0 ipc, 1 tcp, 2 rdma
  uint32_t group_access;  // 1: every segment of the instance (pools too) is 0660, else 0600
  // The model's KV heads over all ranks; 0: kv_heads * tp_size. Fewer than
  // tp_size: heads replicated over ranks (instance/head_layout.h).
  uint32_t total_kv_heads;
  // 1: the engine registers each rank's device pool (--pool none), and a
  // worker makes none of its own; 0: a worker makes a host-memory pool in
  // /dev/shm (--pool host). The host swap tier is host_blocks' either way.
  uint32_t engine_pools;
  // 1: the cache has no V (an MLA latent cache: kvrelay/pool_geometry.h).
  uint32_t k_only;
  uint32_t reserved_geometry[1];

  // Rings. Byte rings are sized in bytes, fixed-record rings in records.
  uint32_t submit_ring_bytes;      // clients -> coordinator (multi-producer)
  uint32_t completion_ring_bytes;  // coordinator -> engine
  uint32_t task_ring_bytes;        // coordinator -> each worker
  uint32_t signal_ring_records;    // engine -> each worker (layer signals)
  uint32_t signal_record_bytes;
  uint32_t report_ring_records;  // each worker -> coordinator
  uint32_t report_record_bytes;
  uint32_t reserved_rings[5];

  // Network: the ports this instance's ranks accept RDMA / TCP handshakes on
  // (decode role), one per rank; 0 when unused.
  uint16_t rdma_ports[kMaxTpSize];
  uint16_t tcp_ports[kMaxTpSize];

  // Time limits.
  uint32_t request_deadline_ms;  // default per-request deadline
  uint32_t heartbeat_interval_ms;
  uint32_t peer_timeout_ms;   // heartbeat age after which a peer is presumed dead
  uint32_t stall_timeout_ms;  // half-written ring records are skipped after this
  // A request that has not finished this long after its final chunk was
  // signalled on a rank is reported by that rank's watchdog (logged, and
  // listed for kvrelay-dump): worker/request_watchdog.h.
  uint32_t stall_report_ms;
  uint32_t reserved_time[3];
};
static_assert(sizeof(InstanceConfig) == 72 + 8 + 64 + 48 + 64 + 32);

inline constexpr uint32_t kProtocolIpc = 1U << 0;
inline constexpr uint32_t kProtocolTcp = 1U << 1;
inline constexpr uint32_t kProtocolRdma = 1U << 2;

// Sensible defaults for `instance` (which the caller must have validated).
InstanceConfig default_config(std::string_view instance, uint32_t tp_size);

// ok, or an error naming the field, its value, and the limit.
Status validate_config(const InstanceConfig& config);

std::string instance_of(const InstanceConfig& config);

}  // namespace kvrelay
