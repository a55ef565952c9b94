// The `ipc` transport for host-memory pools: the decode instance runs on the
// same host, so the pool of the decode rank this rank sends to (the
// CacheDest's device_ids[rank]) is mapped into this worker (found through the
// decode instance's control segment and pool directory) and every layer's
// runs are plain memcpys from the local pool into it.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "shm/control_segment.h"
#include "shm/liveness.h"
#include "shm/peer_instances.h"
#include "shm/pool_segment.h"
#include "worker/destination.h"

namespace kvrelay::worker {

class HostIpcDestination : public Destination {
 public:
  HostIpcDestination(const HostPool& local, std::shared_ptr<const HostPool> peer)
      : local_(local), peer_(std::move(peer)) {}
  uint32_t blocks_in_layer(uint32_t layer) const override {
    return peer_->geometry().blocks_in_layer(layer);
  }
  Result<uint64_t> copy_layer(uint32_t layer, std::span<const BlockRun> runs) override;
  void fence() override;

 private:
  const HostPool& local_;
  std::shared_ptr<const HostPool> peer_;
  std::vector<kernels::CopyRun> scratch_;
};

// Resolves ipc destinations to peer pools, keeping each peer instance mapped
// while its coordinator lives.
class HostDestinationResolver : public DestinationResolver {
 public:
  HostDestinationResolver(uint32_t rank, const HostPool& local) : rank_(rank), local_(local) {}
  Result<std::shared_ptr<Destination>> resolve(schema::CacheDest::Reader dest) override;
  Status check_connect(schema::ConnectTask::Reader connect) override;

  // Decode rank `peer_rank`'s pool of `peer_instance`, mapped (cached while
  // the peer's coordinator lives).
  Result<std::shared_ptr<const HostPool>> peer_pool(const std::string& peer_instance,
                                                    uint32_t peer_rank);

 private:
  struct Mapped {
    const ControlSegment* control;  // the peer segment it was found through
    std::shared_ptr<const HostPool> pool;
  };
  uint32_t rank_;
  const HostPool& local_;
  PeerInstances peers_;
  std::unordered_map<std::string, Mapped> pools_;  // by "<instance>/<rank>"
};

// Why two pools cannot exchange blocks (different block shapes), or ok.
Status check_compatible(const PoolGeometry& local, const PoolGeometry& peer);

}  // namespace kvrelay::worker
