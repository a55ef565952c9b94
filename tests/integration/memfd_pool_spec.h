// How an engine registers a memfd pool (Client::register_pool): the memfds
// and every tensor's place in them.
#pragma once

#include <vector>

#include "kvrelay/client.h"
#include "support/memfd_pool.h"

namespace kvrelay::testing {

inline PoolSpec memfd_pool_spec(const MemfdPool& pool, uint32_t rank) {
  PoolSpec s;
  s.rank = rank;
  s.location = PoolLocation::kHostFd;
  const std::vector<int> fds = pool.fds();
  for (size_t m = 0; m < pool.memories(); ++m) {
    PoolMemorySpec memory;
    memory.bytes = pool.memory_bytes(m);
    memory.fd = fds[m];
    s.memories.push_back(memory);
  }
  const PoolGeometry& g = pool.geometry();
  for (uint32_t t = 0; t < g.total_layers() * g.tensors_per_layer(); ++t)
    s.tensors.push_back(TensorPlacement{pool.memory_of(t), pool.offset_of(t)});
  return s;
}

}  // namespace kvrelay::testing
