// A pool's memory registered on an RDMA device: every tensor of every layer,
// with tensors that lie back to back in memory (a shared-memory pool's
// usually all do) merged into as few registrations as possible. A sender
// reads through the lkeys; a receiver hands the rkeys and addresses to its
// peers (RdmaMemoryRegions). Held for as long as the pool is: once per pool
// epoch, not once per transfer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/local_pool.h"
#include "worker/rdma/endpoint_codec.h"
#include "worker/rdma/fabric.h"

namespace kvrelay::worker::rdma {

class RegisteredPool {
 public:
  static Result<std::unique_ptr<RegisteredPool>> create(Fabric& fabric, const LocalPool& pool);

  const LocalPool& pool() const { return pool_; }
  uint32_t lkey(uint32_t layer, uint32_t tensor) const { return at(layer, tensor).lkey; }
  uint64_t address(uint32_t layer, uint32_t tensor) const { return at(layer, tensor).address; }
  // One per (layer, tensor), layer-major: what encode_regions() takes.
  const std::vector<RemoteTensor>& tensors() const { return tensors_; }
  size_t registrations() const { return registrations_.size(); }

 private:
  struct Keys {
    uint64_t address;
    uint32_t lkey;
  };
  explicit RegisteredPool(const LocalPool& pool) : pool_(pool) {}
  const Keys& at(uint32_t layer, uint32_t tensor) const {
    return keys_[size_t{layer} * pool_.geometry().tensors_per_layer() + tensor];
  }

  const LocalPool& pool_;
  std::vector<std::unique_ptr<Registration>> registrations_;
  std::vector<RemoteTensor> tensors_;
  std::vector<Keys> keys_;
};

}  // namespace kvrelay::worker::rdma
