// What an engine can know of the instance it attached to (Client::info()):
// a copy taken at attach, in plain types. The instance's configuration never
// changes while its coordinator lives.
//
// Part of kvrelay's public face (self-contained).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvrelay/pool_geometry.h"
#include "kvrelay/types.h"

namespace kvrelay {

struct InstanceInfo {
  std::string instance;
  Role role = Role::kMixed;
  uint32_t tp_size = 0;

  // Every rank's device-tier pool has this shape (num_layers, num_blocks,
  // dtype, ...).
  PoolGeometry device_pool;
  // The host (offload) tier of swap tasks; num_blocks is 0 when the
  // instance has none.
  PoolGeometry host_pool;
  // The model's KV heads over all ranks: device_pool.kv_heads x tp_size, or
  // fewer than tp_size where each head is replicated over several ranks.
  uint32_t total_kv_heads = 0;

  // Transfer protocols this instance accepts as a destination.
  bool accepts_ipc = false;
  bool accepts_tcp = false;
  bool accepts_rdma = false;
  // Per rank: the port its worker accepts tcp / rdma handshakes on (0: none).
  std::vector<uint16_t> tcp_ports;
  std::vector<uint16_t> rdma_ports;

  uint32_t request_deadline_ms = 0;  // a request's deadline when it names none
  uint32_t heartbeat_interval_ms = 0;
  uint32_t peer_timeout_ms = 0;  // a silent peer is presumed dead after this

  // The model KV head that head 0 of rank `rank`'s pool holds (the rank
  // holds device_pool.kv_heads consecutive heads from there).
  uint32_t first_kv_head(uint32_t rank) const {
    if (total_kv_heads != 0 && tp_size > total_kv_heads) return rank / (tp_size / total_kv_heads);
    return rank * device_pool.kv_heads;
  }
  const PoolGeometry& pool(PoolTier tier) const {
    return tier == PoolTier::kHost ? host_pool : device_pool;
  }
};

}  // namespace kvrelay
