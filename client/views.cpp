#include "client/views.h"

#include <optional>

#include "instance/head_layout.h"
#include "instance/pool_geometry.h"

namespace kvrelay {

InstanceInfo instance_info_of(const InstanceConfig& c) {
  InstanceInfo info;
  info.instance = instance_of(c);
  info.role = static_cast<Role>(c.role);
  info.tp_size = c.tp_size;
  info.device_pool = pool_geometry_of(c, PoolTier::kDevice);
  info.host_pool = pool_geometry_of(c, PoolTier::kHost);
  info.total_kv_heads = head_layout_of(c).total_heads;
  info.accepts_ipc = (c.protocols & kProtocolIpc) != 0;
  info.accepts_tcp = (c.protocols & kProtocolTcp) != 0;
  info.accepts_rdma = (c.protocols & kProtocolRdma) != 0;
  info.tcp_ports.assign(c.tcp_ports, c.tcp_ports + c.tp_size);
  info.rdma_ports.assign(c.rdma_ports, c.rdma_ports + c.tp_size);
  info.request_deadline_ms = c.request_deadline_ms;
  info.heartbeat_interval_ms = c.heartbeat_interval_ms;
  info.peer_timeout_ms = c.peer_timeout_ms;
  return info;
}

struct PoolView::Impl {
  std::optional<HostPool> pool;  // a host segment, or:
  PoolGeometry geometry;
  std::string name;
  uint32_t rank = 0;
  uint64_t bytes = 0;
  std::vector<std::byte*> tensors;  // [layer * tensors_per_layer + tensor]
  std::shared_ptr<void> owner;      // keeps the tensors' memory mapped
};

PoolView pool_view_of(HostPool pool) {
  auto impl = std::make_unique<PoolView::Impl>();
  impl->geometry = pool.geometry();
  impl->name = pool.name();
  impl->rank = pool.rank();
  impl->bytes = pool.bytes();
  impl->pool.emplace(std::move(pool));
  return PoolView(std::move(impl));
}

PoolView pool_view_of(const PoolGeometry& geometry, std::vector<std::byte*> tensors,
                      std::shared_ptr<void> owner, std::string name, uint32_t rank) {
  auto impl = std::make_unique<PoolView::Impl>();
  impl->geometry = geometry;
  impl->name = std::move(name);
  impl->rank = rank;
  for (uint32_t l = 0; l < geometry.total_layers(); ++l)
    for (uint32_t slot = 0; slot < geometry.tensors_per_layer(); ++slot)
      impl->bytes += geometry.tensor_bytes(l, geometry.tensor_at(slot));
  impl->tensors = std::move(tensors);
  impl->owner = std::move(owner);
  return PoolView(std::move(impl));
}

PoolView::PoolView(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PoolView::~PoolView() = default;
PoolView::PoolView(PoolView&&) noexcept = default;
PoolView& PoolView::operator=(PoolView&&) noexcept = default;

const PoolGeometry& PoolView::geometry() const {
  return impl_->geometry;
}
const std::string& PoolView::segment_name() const {
  return impl_->name;
}
uint32_t PoolView::rank() const {
  return impl_->rank;
}
uint64_t PoolView::bytes() const {
  return impl_->bytes;
}
std::byte* PoolView::tensor(uint32_t layer, PoolTensor t) const {
  if (impl_->pool) return impl_->pool->tensor(layer, t);
  const PoolGeometry& g = impl_->geometry;
  if (layer >= g.total_layers() || !g.has_tensor(t)) return nullptr;
  return impl_->tensors[size_t{layer} * g.tensors_per_layer() + g.slot_of(t)];
}
std::byte* PoolView::block(uint32_t layer, PoolTensor t, uint32_t block_id) const {
  if (impl_->pool) return impl_->pool->block(layer, t, block_id);
  std::byte* base = tensor(layer, t);
  if (base == nullptr || block_id >= impl_->geometry.blocks_in_layer(layer)) return nullptr;
  return base + uint64_t{block_id} * impl_->geometry.block_bytes(t);
}
Status PoolView::check_intact() const {
  return impl_->pool ? impl_->pool->check_intact() : Status{};
}

}  // namespace kvrelay
