// A pool this worker can address: its rank's own pools, and a peer's pool
// mapped for the ipc transport. The scheduler, the transports and the swap
// engine see only this, so that a shared-memory segment (HostSegmentPool,
// below) and an engine's own memory, host memfds or GPU memory
// (ImportedPool, imported_pool.h), are interchangeable behind it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "instance/pool_geometry.h"
#include "instance/pool_segment.h"
#include "kernels/copy_engine.h"
#include "shm/result.h"

namespace kvrelay::worker {

class LocalPool {
 public:
  virtual ~LocalPool() = default;
  virtual const PoolGeometry& geometry() const = 0;
  // What the operator sees in logs and in the pool directory.
  virtual const std::string& name() const = 0;
  virtual uint64_t bytes() const = 0;
  virtual kernels::MemoryKind memory_kind() const = 0;
  // The GPU that copies to and from this pool run on; -1 for host memory.
  virtual int cuda_device() const { return -1; }
  // The host memory it maps (to pin it for a GPU's copies); none for GPU memory.
  virtual std::vector<std::span<std::byte>> host_memory() const = 0;
  // Base of a tensor; nullptr for a tensor the pool does not have.
  virtual std::byte* tensor(uint32_t layer, PoolTensor t) const = 0;
  // Whether bytes copied through this pool can be trusted: kCorrupt naming
  // the pool when another process truncated it under us.
  virtual Status check_intact() const = 0;
  virtual bool truncated() const = 0;
};

// A shared-memory host pool (instance/pool_segment.h).
class HostSegmentPool final : public LocalPool {
 public:
  explicit HostSegmentPool(HostPool pool) : pool_(std::move(pool)) {}
  const PoolGeometry& geometry() const override { return pool_.geometry(); }
  const std::string& name() const override { return pool_.name(); }
  uint64_t bytes() const override { return pool_.bytes(); }
  kernels::MemoryKind memory_kind() const override { return kernels::MemoryKind::kHost; }
  std::byte* tensor(uint32_t layer, PoolTensor t) const override { return pool_.tensor(layer, t); }
  Status check_intact() const override { return pool_.check_intact(); }
  bool truncated() const override { return pool_.truncated(); }
  std::vector<std::span<std::byte>> host_memory() const override { return {pool_.mapping()}; }
  const HostPool& segment() const { return pool_; }

 private:
  HostPool pool_;
};

}  // namespace kvrelay::worker
