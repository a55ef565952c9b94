#include "worker/data_plane.h"

#include <fmt/format.h>

#include "instance/pool_segment.h"
#include "worker/pools.h"

namespace kvrelay::worker {

Result<std::unique_ptr<DataPlane>> DataPlane::open(const ControlSegment& control, uint32_t rank,
                                                   const NetworkOptions& network,
                                                   WaitEvent& doorbell, Hooks hooks) {
  std::unique_ptr<DataPlane> d(new DataPlane(control, rank, network, doorbell, std::move(hooks)));
  Result<std::unique_ptr<LocalPool>> device = open_or_create_pool(control, rank, PoolTier::kDevice);
  if (!device) return device.error();
  d->device_pool_ = std::move(device).value();
  if (control.config().host_blocks > 0) {
    Result<std::unique_ptr<LocalPool>> host = open_or_create_pool(control, rank, PoolTier::kHost);
    if (!host) return host.error();
    d->host_pool_ = std::move(host).value();
  }
  if (Status s = d->serve_device_pool(); !s) return s.error();
  d->start_swap_engine();
  return d;
}

DataPlane::DataPlane(const ControlSegment& control, uint32_t rank, NetworkOptions network,
                     WaitEvent& doorbell, Hooks hooks)
    : control_(control),
      rank_(rank),
      network_(std::move(network)),
      doorbell_(doorbell),
      hooks_(std::move(hooks)) {}

DataPlane::~DataPlane() = default;

Status DataPlane::serve_device_pool() {
  Result<std::unique_ptr<Transports>> transports =
      Transports::create(control_.config(), rank_, *device_pool_, network_, &doorbell_, &control_);
  if (!transports) return transports.error();
  transports_ = std::move(transports).value();
  scheduler_ =
      std::make_unique<SendScheduler>(rank_, device_pool_->geometry(), *transports_, hooks_.report);
  scheduler_->set_latency_observer(hooks_.latency);
  scheduler_->set_hop_observer(hooks_.hop);
  return {};
}

void DataPlane::start_swap_engine() {
  swap_.reset();
  if (host_pool_)
    swap_ = std::make_unique<SwapEngine>(rank_, *device_pool_, *host_pool_,
                                         kernels::make_host_copy_engine(),
                                         &control_.swap_progress(), doorbell_);
}

PoolRegistration DataPlane::register_pool(schema::PoolDescriptor::Reader d) {
  PoolRegistration out;
  if (d.getLocation() != schema::PoolDescriptor::Location::HOST_SEGMENT) {
    out.message = "CUDA IPC pools need a CUDA build and a GPU";
    return out;
  }
  const PoolTier tier =
      d.getTier() == schema::PoolDescriptor::Tier::HOST ? PoolTier::kHost : PoolTier::kDevice;
  if (scheduler_->live_requests() != 0 || (swap_ && swap_->pending() != 0)) {
    out.message = fmt::format("{} requests are in flight; register pools before sending",
                              scheduler_->live_requests());
    return out;
  }
  const PoolGeometry expected = pool_geometry_of(control_.config(), tier);
  Result<HostPool> pool = HostPool::open(d.getSegmentName().cStr(), &expected);
  if (!pool) {
    out.message = pool.error().message;
    return out;
  }
  // A pool this worker created and the engine's now replaces is nobody's
  // any more: its name goes (the coordinator removes only the pools the
  // directory lists as kvrelay's at shutdown), its memory once unmapped.
  const bool ours =
      control_.pool_directory().slots[rank_][static_cast<uint32_t>(tier)].created_by_kvrelay != 0;
  Result<std::string> replaced = find_pool(control_, rank_, tier);
  publish_pool(control_, rank_, tier, pool->name(), pool->bytes(), false);
  if (ours && replaced && *replaced != pool->name()) (void)SharedSegment::unlink(*replaced);
  auto owned = std::make_unique<HostSegmentPool>(std::move(pool).value());
  swap_.reset();  // it holds the old pools
  if (tier == PoolTier::kDevice) {
    scheduler_.reset();
    transports_.reset();
    device_pool_ = std::move(owned);
    if (Status s = serve_device_pool(); !s) {
      out.broken = true;
      out.message = s.error().message;
      return out;
    }
  } else {
    host_pool_ = std::move(owned);
  }
  start_swap_engine();
  out.registered = true;
  return out;
}

const LocalPool* DataPlane::truncated_pool() const {
  for (const LocalPool* pool : {device_pool_.get(), host_pool_.get()})
    if (pool != nullptr && pool->truncated()) return pool;
  return nullptr;
}

}  // namespace kvrelay::worker
