#include "client/views.h"

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
  HostPool pool;
};

PoolView pool_view_of(HostPool pool) {
  return PoolView(std::make_unique<PoolView::Impl>(PoolView::Impl{std::move(pool)}));
}

PoolView::PoolView(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PoolView::~PoolView() = default;
PoolView::PoolView(PoolView&&) noexcept = default;
PoolView& PoolView::operator=(PoolView&&) noexcept = default;

const PoolGeometry& PoolView::geometry() const {
  return impl_->pool.geometry();
}
const std::string& PoolView::segment_name() const {
  return impl_->pool.name();
}
uint32_t PoolView::rank() const {
  return impl_->pool.rank();
}
uint64_t PoolView::bytes() const {
  return impl_->pool.bytes();
}
std::byte* PoolView::tensor(uint32_t layer, PoolTensor t) const {
  return impl_->pool.tensor(layer, t);
}
std::byte* PoolView::block(uint32_t layer, PoolTensor t, uint32_t block_id) const {
  return impl_->pool.block(layer, t, block_id);
}
Status PoolView::check_intact() const {
  return impl_->pool.check_intact();
}

}  // namespace kvrelay
