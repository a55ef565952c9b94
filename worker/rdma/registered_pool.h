// A pool's memory registered on an RDMA device: every tensor of every layer,
// with tensors that lie back to back in memory (a shared-memory pool's
// usually all do) merged into as few registrations as possible. A sender
// reads through the lkeys; a receiver hands the rkeys and addresses to its
// peers (RdmaMemoryRegions). Held for as long as the pool is: once per pool
// epoch, not once per transfer.
//
// Where the device binds memory windows, the pool is registered for them
// only (RemoteAccess::kWindowsOnly): its own rkeys write nothing remotely,
// and a peer writes only through the windows a grant binds for it
// (rdma_receiver.h). Elsewhere the registration allows remote writes, and
// grants hand out its rkeys (docs/transports.md says what that trusts).
//
// A pool in GPU memory is registered for GPUDirect RDMA: each allocation's
// tensors through a dma-buf of it (ibv_reg_dmabuf_mr), addressed by their
// device addresses; where the driver will not export one, by the device
// addresses themselves (ibv_reg_mr, which works where nvidia-peermem is
// loaded). Neither: an error that names both reasons.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/dmabuf.h"
#include "worker/local_pool.h"
#include "worker/rdma/endpoint_codec.h"
#include "worker/rdma/fabric.h"

namespace kvrelay::worker::rdma {

class RegisteredPool {
 public:
  // `exporter`: how GPU memory becomes a dma-buf (kernels::export_dmabuf;
  // the tests' stand-in).
  static Result<std::unique_ptr<RegisteredPool>> create(
      Fabric& fabric, const LocalPool& pool,
      const kernels::DmabufExporter& exporter = kernels::export_dmabuf);

  const LocalPool& pool() const { return pool_; }
  uint32_t lkey(uint32_t layer, uint32_t tensor) const { return at(layer, tensor).lkey; }
  uint64_t address(uint32_t layer, uint32_t tensor) const { return at(layer, tensor).address; }
  // The registration that holds a tensor: what a window over it is bound on.
  const Registration& registration(uint32_t layer, uint32_t tensor) const {
    return *at(layer, tensor).registration;
  }
  // Registered for memory windows only (true), or for remote writes.
  bool windows() const { return windows_; }
  // One per (layer, tensor), layer-major: what encode_regions() takes.
  const std::vector<RemoteTensor>& tensors() const { return tensors_; }
  size_t registrations() const { return registrations_.size(); }
  // Of those, how many are of dma-bufs (GPU memory).
  size_t dmabuf_registrations() const { return dmabuf_registrations_; }

 private:
  struct Keys {
    uint64_t address;
    uint32_t lkey;
    const Registration* registration;
  };
  explicit RegisteredPool(const LocalPool& pool) : pool_(pool) {}
  const Keys& at(uint32_t layer, uint32_t tensor) const {
    return keys_[size_t{layer} * pool_.geometry().tensors_per_layer() + tensor];
  }

  const LocalPool& pool_;
  std::vector<std::unique_ptr<Registration>> registrations_;
  std::vector<RemoteTensor> tensors_;
  std::vector<Keys> keys_;
  size_t dmabuf_registrations_ = 0;
  bool windows_ = false;
};

}  // namespace kvrelay::worker::rdma
