// Pools for the transport benchmarks (tcp, rdma): kLayers layers of K and V,
// `block_bytes` per block and tensor, about `layer_bytes` per layer, in
// shared-memory segments that are unlinked at once (gone with the process).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>

#include "instance/pool_segment.h"
#include "worker/local_pool.h"

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

}  // namespace kvrelay::bench
