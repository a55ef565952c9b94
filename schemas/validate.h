// Validation of decoded messages against an instance's configuration.
//
// Every check returns ok or an Error (kInvalidArgument) whose message names
// the message, the request, the field, the value and the limit, e.g.
//
//   CacheDest 'req-17': dest_block_ids has 40 entries but src_block_ids has 32
//
// so that the engine developer who receives it in an error completion knows
// what to fix. Validators read capnp readers; any capnp error while reading
// (a malformed message) is turned into kCorrupt by messages::with_message().
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "instance/fd_socket.h"
#include "instance/instance_config.h"
#include "instance/instance_status.h"
#include "instance/pool_geometry.h"
#include "schemas/kvrelay.capnp.h"
#include "shm/result.h"

namespace kvrelay::messages {

inline constexpr size_t kMaxRequestIdBytes = 128;
inline constexpr uint32_t kMaxEngineSlots = kEngineSlots;
inline constexpr size_t kMaxAddressBytes = 255;
inline constexpr size_t kCudaIpcHandleBytes = 64;
// A registered pool's tensors start on multiples of this (the gather
// kernel's 16-byte vectors).
inline constexpr uint64_t kTensorAlignment = 16;
// File descriptors of one registration (cudaVmm, hostFd). They travel
// 253 to a message (SCM_MAX_FD); a large pool in 20 MiB VMM chunks needs
// thousands.
inline constexpr uint32_t kMaxPoolFds = kMaxFdsPerTicket;
// Per-request deadlines (deadline_ms) longer than an hour are refused: the
// coordinator remembers ended ids for as long as their partner may still come.
inline constexpr uint32_t kMaxDeadlineMs = 3'600'000;

// The parts of an instance's configuration that bound its messages.
struct Limits {
  uint32_t tp_size = 1;
  // This instance's (device tier) pool; one block of one token by default.
  PoolGeometry pool = {
      .num_layers = 1, .num_blocks = 1, .kv_heads = 1, .block_size = 1, .head_dim = 1};
  uint32_t host_blocks = 0;  // host tier of swap tasks; 0 means none
  uint32_t protocols = 7;    // bit 0 ipc, 1 tcp, 2 rdma: what this instance accepts
  uint32_t role = 2;         // Role (instance/instance_config.h); decode by default
  static Limits from(const InstanceConfig& config);
  uint32_t total_layers() const { return pool.total_layers(); }
};

// request ids: 1..128 printable ASCII characters without spaces.
Status validate_request_id(std::string_view message, capnp::Text::Reader id);

Status validate(schema::CacheTask::Reader task, const Limits& limits);
// `peer_num_blocks`: the decode pool's block count, when known (ipc); the
// decode side's own worker checks again either way.
Status validate(schema::CacheDest::Reader dest, const Limits& limits,
                std::optional<uint32_t> peer_num_blocks = std::nullopt);
// Rules that need both halves (the destination is not longer than the source).
Status validate_pair(schema::CacheTask::Reader task, schema::CacheDest::Reader dest);
Status validate(schema::SwapTask::Reader swap, const Limits& limits);
Status validate(schema::ExpectArrival::Reader expect, const Limits& limits);
Status validate(schema::ConnectTask::Reader connect, const Limits& limits);
Status validate(schema::Cancel::Reader cancel, const Limits& limits);
// The pool's shape must be this instance's; a tensor table (cudaIpc,
// cudaVmm, hostFd) must place every tensor inside its allocation, aligned,
// without overlaps (schemas/validate_pool.cpp).
Status validate(schema::RegisterPool::Reader reg, const Limits& limits);

// A message's encoded size against the ring record limit it must fit in.
Status validate_record_size(std::string_view message, std::string_view request_id, size_t bytes,
                            size_t limit, std::string_view ring_name);

}  // namespace kvrelay::messages
