// What the two ends of a connection say of themselves once the key is
// proved: the connecting side's instance, rank and pool (Hello), and the
// accepting side's answer (HelloAck). A listener serves a hello only when
// its pool can take what that side sends: the same geometry, or
// (heterogeneous TP) the same model heads split another way.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "instance/head_layout.h"
#include "instance/pool_geometry.h"
#include "shm/result.h"

namespace kvrelay::worker::net {

// 2: the session is sealed (session_seal.h) and transports' messages travel
// as TransportMessage. 3: an rdma intent names its queue pair and its grant
// carries the keys to write with. 4: a tcp frame may carry several runs
// (TcpFrameHeader.runs), which a version-3 receiver would write as one.
inline constexpr uint32_t kWireVersion = 4;

struct Hello {
  uint32_t version = 0;
  std::string instance;           // the connecting side's
  std::string expected_instance;  // the instance it means to reach; empty: any
  uint32_t rank = 0;
  uint32_t tp_size = 0;
  uint32_t total_kv_heads = 0;  // 0: pool.kv_heads x tp_size
  PoolGeometry pool;
};

struct HelloAck {
  bool accepted = false;
  std::string reason;
  PoolGeometry pool;
  uint64_t epoch = 0;
  uint32_t tp_size = 0;  // the accepting instance's; 0: unknown
  uint32_t total_kv_heads = 0;
};

// What a sending rank says in its hello.
inline Hello make_hello(const std::string& instance, const std::string& expected_instance,
                        uint32_t rank, uint32_t tp_size, const PoolGeometry& pool,
                        uint32_t total_kv_heads = 0) {
  Hello h;
  h.version = kWireVersion;
  h.instance = instance;
  h.expected_instance = expected_instance;
  h.rank = rank;
  h.tp_size = tp_size;
  h.total_kv_heads = total_kv_heads;
  h.pool = pool;
  return h;
}

// Why a peer's hello cannot be served by this side, or ok: version, the
// instance it expects, and the pool geometry (naming the field). `heads`:
// this instance's layout; with it, a sender of another TP size serving the
// same model heads is accepted (without: the pools must match exactly).
Status check_hello(const Hello& hello, const std::string& instance, const PoolGeometry& local,
                   const std::optional<HeadLayout>& heads = std::nullopt);

// The sender's layout as its hello describes it.
HeadLayout sender_layout(const Hello& hello);

}  // namespace kvrelay::worker::net
