// Pools for the transport benchmarks (tcp, rdma): kLayers layers of K and V,
// `block_bytes` per block and tensor, about `layer_bytes` per layer, in
// shared-memory segments that are unlinked at once (gone with the process).
#pragma once

#include <capnp/message.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "instance/pool_segment.h"
#include "worker/local_pool.h"
#include "worker/transport.h"

namespace kvrelay::bench {

inline constexpr uint32_t kLayers = 4;

inline PoolGeometry geometry_for(uint64_t block_bytes, uint64_t layer_bytes) {
  PoolGeometry g;
  g.num_layers = kLayers;
  g.kv_heads = 1;
  g.block_size = 16;
  g.head_dim = static_cast<uint32_t>(block_bytes / 16 / 2);  // bf16
  g.dtype = static_cast<uint32_t>(CacheDtype::kBf16);
  g.num_blocks = static_cast<uint32_t>(std::max<uint64_t>(1, layer_bytes / 2 / block_bytes));
  return g;
}

inline std::unique_ptr<worker::HostSegmentPool> make_pool(const std::string& name,
                                                          const PoolGeometry& g) {
  (void)SharedSegment::unlink(name);
  Result<HostPool> pool = HostPool::create(name, 0, PoolTier::kDevice, g);
  if (!pool) {
    fmt::print(stderr, "cannot create pool {}: {}\n", name, pool.error().message);
    std::exit(1);
  }
  (void)SharedSegment::unlink(name);  // gone with this process
  return std::make_unique<worker::HostSegmentPool>(std::move(pool).value());
}

// A loopback transport benchmark's destination: its receiver's `port` on
// 127.0.0.1 over `protocol`, as `sender` resolves it; exits saying why not.
inline std::shared_ptr<worker::Destination> loopback_destination(worker::Transport& sender,
                                                                 schema::TransferProtocol protocol,
                                                                 uint16_t port,
                                                                 const std::string& instance = "") {
  capnp::MallocMessageBuilder m;
  auto d = m.initRoot<schema::CacheDest>();
  d.setProtocol(protocol);
  d.setPeerAddress("127.0.0.1");
  d.setPeerInstance(instance);
  (protocol == schema::TransferProtocol::RDMA ? d.initRdmaPorts(1) : d.initTcpPorts(1))
      .set(0, port);
  Result<std::shared_ptr<worker::Destination>> dest = sender.resolve(d.asReader());
  if (!dest) {
    fmt::print(stderr, "{}\n", dest.error().message);
    std::exit(1);
  }
  return std::move(dest).value();
}

}  // namespace kvrelay::bench
