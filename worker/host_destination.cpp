#include "worker/host_destination.h"

#include <fmt/format.h>

#include <atomic>

#include "shm/liveness.h"
#include "worker/tcp_probe.h"

namespace kvrelay::worker {

Result<uint64_t> HostIpcDestination::copy_layer(uint32_t layer, std::span<const BlockRun> runs) {
  uint64_t moved = 0;
  const PoolGeometry& g = local_.geometry();
  for (uint32_t t = 0; t < g.tensors_per_layer(); ++t) {
    const auto tensor = static_cast<PoolTensor>(t);
    const std::byte* src = local_.tensor(layer, tensor);
    std::byte* dst = peer_->tensor(layer, tensor);
    if (src == nullptr || dst == nullptr)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("layer {} tensor {} missing", layer, t));
    to_byte_runs(runs, g.block_bytes(tensor), scratch_);
    kernels::copy_runs_host(src, dst, scratch_);
    moved += kernels::run_bytes(scratch_);
  }
  // A pool truncated under us reads and writes zeros: the copy is garbage.
  if (Status s = local_.check_intact(); !s) return s.error();
  if (Status s = peer_->check_intact(); !s) return s.error();
  return moved;
}

void HostIpcDestination::fence() {
  // Host memory: order the copies before the report that publishes them.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

Status check_compatible(const PoolGeometry& local, const PoolGeometry& peer) {
  const struct {
    const char* what;
    uint64_t mine;
    uint64_t theirs;
  } fields[] = {{"layers", local.total_layers(), peer.total_layers()},
                {"kv_heads", local.kv_heads, peer.kv_heads},
                {"block_size", local.block_size, peer.block_size},
                {"head_dim", local.head_dim, peer.head_dim},
                {"dtype", local.dtype, peer.dtype},
                {"has_scales", local.has_scales, peer.has_scales}};
  for (const auto& f : fields) {
    if (f.mine != f.theirs)
      return make_error(
          Errc::kLayoutMismatch,
          fmt::format("pools differ in {}: {} here, {} at the peer", f.what, f.mine, f.theirs));
  }
  return {};
}

Result<std::shared_ptr<const HostPool>> HostDestinationResolver::peer_pool(
    const std::string& peer_instance, uint32_t peer_rank) {
  Result<const ControlSegment*> control = peers_.get(peer_instance);
  if (!control) return control.error();
  const std::string key = fmt::format("{}/{}", peer_instance, peer_rank);
  auto it = pools_.find(key);
  // Keep the mapping while the peer's segment is the same (re-mapping a pool
  // costs a populate of every page); a restarted peer has a new one.
  if (it != pools_.end() && it->second.control == *control && !it->second.pool->truncated())
    return it->second.pool;
  const InstanceConfig& peer = (*control)->config();
  if (peer.role != static_cast<uint32_t>(Role::kDecode))
    return make_error(Errc::kInvalidArgument,
                      fmt::format("peer instance '{}' has role {}; only a decode instance accepts "
                                  "transfers",
                                  peer_instance, role_name(static_cast<Role>(peer.role))));
  if (peer_rank >= peer.tp_size)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("decode rank {} does not exist: peer instance '{}' has {} ranks",
                                  peer_rank, peer_instance, peer.tp_size));
  Result<std::string> name = find_pool(**control, peer_rank, PoolTier::kDevice);
  if (!name) return name.error();
  Result<HostPool> pool = HostPool::open(*name, nullptr);
  if (!pool) return pool.error();
  if (Status s = check_compatible(local_.geometry(), pool->geometry()); !s)
    return make_error(s.code(),
                      fmt::format("peer instance '{}': {}", peer_instance, s.error().message));
  auto shared = std::make_shared<const HostPool>(std::move(pool).value());
  pools_[key] = Mapped{*control, shared};
  return shared;
}

Result<std::shared_ptr<Destination>> HostDestinationResolver::resolve(
    schema::CacheDest::Reader dest) {
  switch (dest.getProtocol()) {
    case schema::TransferProtocol::IPC: {
      const auto devices = dest.getDeviceIds();
      if (rank_ >= devices.size())
        return make_error(Errc::kInvalidArgument,
                          fmt::format("device_ids has no entry for rank {}", rank_));
      Result<std::shared_ptr<const HostPool>> pool =
          peer_pool(dest.getPeerInstance().cStr(), devices[rank_]);
      if (!pool) return pool.error();
      return std::shared_ptr<Destination>(std::make_shared<HostIpcDestination>(local_, *pool));
    }
    case schema::TransferProtocol::TCP:
    case schema::TransferProtocol::RDMA:
      return make_error(
          Errc::kInvalidArgument,
          fmt::format("protocol {} is not available in this build: only ipc between "
                      "instances on one host moves data so far",
                      dest.getProtocol() == schema::TransferProtocol::TCP ? "tcp" : "rdma"));
  }
  return make_error(Errc::kInvalidArgument, "unknown protocol");
}

Status HostDestinationResolver::check_connect(schema::ConnectTask::Reader connect) {
  if (connect.getProtocol() == schema::TransferProtocol::IPC) {
    Result<std::shared_ptr<const HostPool>> pool =
        peer_pool(connect.getPeerInstance().cStr(), rank_);
    return pool ? Status{} : Status(pool.error());
  }
  const auto ports = connect.getPorts();
  if (rank_ >= ports.size())
    return make_error(Errc::kInvalidArgument, fmt::format("no port for rank {}", rank_));
  return tcp_probe(connect.getPeerAddress().cStr(), ports[rank_], std::chrono::seconds(2));
}

}  // namespace kvrelay::worker
