// Instance-wide status shared by every process of an instance: readiness,
// and the doorbells the consumers park on.
//
// Doorbells: every process that consumes several rings (the coordinator: the
// submit ring and every report ring; a worker: its task ring and its signal
// ring) parks on one WaitEvent of its own, with a predicate that looks at all
// its rings. Every producer, after writing to any of those rings, rings the
// consumer's doorbell (notify_waiters: a compiler barrier and a load when
// nobody is parked); the one exception is a rank's finished report while
// other ranks' reports of the same request are still to come
// (report_wake_gate.h).
#pragma once

#include <atomic>
#include <cstdint>

#include "instance/instance_config.h"
#include "instance/report_wake_gate.h"
#include "kvrelay/types.h"
#include "shm/wait_event.h"

namespace kvrelay {

inline constexpr size_t kExitReasonBytes = 192;

// The engine's batch slots (the original's 512): a CacheTask's engineSlot
// and a batch entry's slot name one of them.
inline constexpr uint32_t kEngineSlots = 512;

struct alignas(64) InstanceStatus {
  WaitEvent state_changed;         // header state or a ready flag changed; sessions acknowledged
  WaitEvent coordinator_doorbell;  // something for the coordinator to read
  WaitEvent worker_doorbell[kMaxTpSize];
  // 1 when rank r is lined up and serving: the original's cache_ready_signal.
  std::atomic<int32_t> ready_flags[kMaxTpSize];
  // Why rank r's worker is down, while it is (instance/exit_reason.h).
  char exit_reason[kMaxTpSize][kExitReasonBytes];
  // Rank r's device signal word: layers the engine's GPU stream has signalled
  // (kernels/stream_signals.h), written by the GPU through a pinned mapping,
  // read by rank r's worker. Only grows. A cache line each.
  struct alignas(64) DeviceSignalWord {
    std::atomic<uint64_t> layers;
  };
  DeviceSignalWord device_signals[kMaxTpSize];
  // The request each engine slot was given last, as its request tag
  // (records::request_tag; 0: none yet). Written by the client that submits
  // the slot's CacheTask, once the task is in the submit ring; read by the
  // clients that push the slot's batch entries, which stamp an untagged
  // entry with it. An untagged entry then names its request exactly, however
  // late the CacheTask reaches the worker and however often the slot was
  // reused before it did (see "Untagged signals" in docs/engine-api.md).
  std::atomic<uint32_t> slot_request_tags[kEngineSlots];
  // Which rank's finished report wakes the coordinator (report_wake_gate.h).
  ReportWakeGates finished_report_gates;
};

// Where a rank's KV pool lives, published by whoever created it (the worker
// in the host default, or the engine through RegisterPool) so that peers can
// find it: a prefill worker maps the decode instance's rank-r pool through
// this directory.
inline constexpr uint32_t kPoolTiers = 2;
inline constexpr size_t kPoolNameBytes = 128;

struct alignas(64) PoolSlot {
  std::atomic<uint32_t> sequence;  // odd while being rewritten
  uint32_t location;               // PoolLocation: other than a segment, peers ask the rank's
                                   // worker for it over its fd socket (instance/fd_socket.h)
  uint64_t pool_bytes;
  uint32_t device_id;
  uint32_t publisher_pid;
  uint32_t created_by_kvrelay;  // 1: a kvrelay worker created it (the coordinator unlinks it at
                                // shutdown)
  char segment_name[kPoolNameBytes];  // NUL-terminated; for other locations, a name unique to
                                      // the registration (it changes when the engine registers
                                      // again)
};

struct PoolDirectory {
  PoolSlot slots[kMaxTpSize][kPoolTiers];
};

}  // namespace kvrelay
