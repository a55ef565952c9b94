#include "worker/data_plane.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "instance/pool_segment.h"
#include "kernels/gpu_identity.h"
#include "schemas/validate.h"
#include "worker/imported_pool.h"
#include "worker/pools.h"

namespace kvrelay::worker {

using Location = schema::PoolDescriptor::Location;
static_assert(
    static_cast<uint32_t>(PoolLocation::kCudaIpc) == static_cast<uint32_t>(Location::CUDA_IPC) &&
    static_cast<uint32_t>(PoolLocation::kCudaVmm) == static_cast<uint32_t>(Location::CUDA_VMM) &&
    static_cast<uint32_t>(PoolLocation::kHostFd) == static_cast<uint32_t>(Location::HOST_FD));

Result<std::unique_ptr<DataPlane>> DataPlane::open(const ControlSegment& control, uint32_t rank,
                                                   const NetworkOptions& network,
                                                   WaitEvent& doorbell, Hooks hooks) {
  std::unique_ptr<DataPlane> d(new DataPlane(control, rank, network, doorbell, std::move(hooks)));
  Result<std::unique_ptr<FdSocketServer>> server = FdSocketServer::start(control.instance(), rank);
  if (server) {
    d->fd_server_ = std::move(server).value();
  } else {
    // Not fatal: only pools registered by fd need it.
    d->no_fd_server_ = server.error().message;
    spdlog::warn("rank {}: no fd socket, so pools cannot be registered by fd: {}", rank,
                 d->no_fd_server_);
  }
  if (control.config().engine_pools == 0) {
    Result<std::unique_ptr<LocalPool>> device =
        open_or_create_pool(control, rank, PoolTier::kDevice);
    if (!device) return device.error();
    d->device_pool_ = std::move(device).value();
  } else {
    spdlog::info("rank {}: no pool of its own (--pool none): serving once the engine registers one",
                 rank);
  }
  if (control.config().host_blocks > 0) {
    Result<std::unique_ptr<LocalPool>> host = open_or_create_pool(control, rank, PoolTier::kHost);
    if (!host) return host.error();
    d->host_pool_ = std::move(host).value();
  }
  if (d->serving()) {
    if (Status s = d->serve_device_pool(); !s) return s.error();
  }
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
  if (hooks_.hop)
    transports_->set_landed_hop_observer(
        [hop = hooks_.hop](uint64_t ns) { hop(kLandedToReadNs, ns); });
  return {};
}

void DataPlane::start_swap_engine() {
  swap_.reset();
  pinned_host_.clear();
  if (!host_pool_ || !device_pool_) return;
  const int device = device_pool_->cuda_device();
  Result<std::unique_ptr<kernels::CopyEngine>> engine =
      kernels::make_copy_engine(device_pool_->memory_kind(), host_pool_->memory_kind(),
                                kernels::CudaCopyOptions{device, network_.copy_max_sms});
  if (!engine) {
    // Only a GPU pool needs more than memcpy, and a GPU pool was mapped with
    // CUDA: this is a CUDA failure. Swaps then fail, saying why.
    spdlog::error("rank {}: no copy engine for swaps: {}", rank_, engine.error().message);
    return;
  }
  if (device >= 0) {
    // Page-locked and mapped once, for as long as the two pools swap: the
    // gather kernel then reaches it through its device address, at the bus's
    // speed, asynchronously (kernels/cuda/cuda_copy_engine.cpp says why not
    // the copy engines).
    for (std::span<std::byte> range : host_pool_->host_memory()) {
      Result<kernels::PinnedHostRange> pinned =
          kernels::PinnedHostRange::pin(range.data(), range.size(), /*mapped=*/true, device);
      if (!pinned) {
        spdlog::warn("rank {}: swaps copy from pageable memory (slower): {}", rank_,
                     pinned.error().message);
        break;
      }
      pinned_host_.push_back(std::move(pinned).value());
    }
  }
  swap_ = std::make_unique<SwapEngine>(rank_, *device_pool_, *host_pool_, std::move(engine).value(),
                                       &control_.swap_progress(), doorbell_);
}

Result<std::unique_ptr<LocalPool>> DataPlane::import_tensor_table(schema::PoolDescriptor::Reader d,
                                                                  PoolTier tier,
                                                                  std::vector<UniqueFd>& fds,
                                                                  uint64_t& ticket) {
  const Location where = d.getLocation();
  ticket = d.getFdTicket();
  if (where != Location::CUDA_IPC) {
    if (!fd_server_)
      return make_error(Errc::kUnsupported,
                        fmt::format("rank {} has no fd socket: {}", rank_, no_fd_server_));
    Result<std::vector<UniqueFd>> claimed = fd_server_->claim(ticket);
    if (!claimed) return claimed.error();
    fds = std::move(claimed).value();
  } else {
    // Legacy handles travel in the message: the registration still gets a
    // name of its own, so that peers see when it changes.
    static thread_local std::mt19937_64 rng(std::random_device{}());
    ticket = rng() | 1U;
  }
  const std::string name = fmt::format("{}:{:016x}", location_name(where), ticket);
  // The engine's GPU by its UUID: its ordinal there need not be ours
  // (kernels/gpu_identity.h).
  int device = static_cast<int>(d.getDeviceId());
  const auto uuid = d.getDeviceUuid();
  const std::span<const uint8_t> uuid_bytes(uuid.begin(), uuid.size());
  if (is_gpu_location(where) && !uuid_bytes.empty()) {
    Result<std::vector<kernels::GpuUuid>> visible = kernels::visible_gpu_uuids();
    if (!visible) return visible.error();
    Result<int> local = kernels::resolve_gpu(uuid_bytes, d.getDeviceId(), *visible);
    if (!local) return local.error();
    device = *local;
  }
  Result<std::unique_ptr<ImportedPool>> pool =
      ImportedPool::open(d, pool_geometry_of(control_.config(), tier), fds, device, name);
  if (!pool) return pool.error();
  spdlog::info(
      "rank {}: mapped the engine's {} pool {} ({} MiB, {} allocations{})", rank_,
      tier == PoolTier::kHost ? "host" : "device", name, (*pool)->bytes() >> 20,
      d.getMemories().size(),
      is_gpu_location(where)
          ? fmt::format(", GPU {} here, the engine's GPU {}{}", device, d.getDeviceId(),
                        uuid_bytes.empty() ? "" : ", " + kernels::gpu_uuid_text(uuid_bytes))
          : "");
  return std::unique_ptr<LocalPool>(std::move(pool).value());
}

PoolRegistration DataPlane::register_pool(schema::PoolDescriptor::Reader d) {
  PoolRegistration out;
  const PoolTier tier =
      d.getTier() == schema::PoolDescriptor::Tier::HOST ? PoolTier::kHost : PoolTier::kDevice;
  if (busy()) {
    out.message = fmt::format("{} requests are in flight; register pools before sending",
                              scheduler_->live_requests());
    return out;
  }
  const Location where = d.getLocation();
  std::unique_ptr<LocalPool> owned;
  std::vector<UniqueFd> fds;
  uint64_t ticket = 0;
  if (where == Location::HOST_SEGMENT) {
    const PoolGeometry expected = pool_geometry_of(control_.config(), tier);
    Result<HostPool> pool = HostPool::open(d.getSegmentName().cStr(), &expected);
    if (!pool) {
      out.message = pool.error().message;
      return out;
    }
    owned = std::make_unique<HostSegmentPool>(std::move(pool).value());
  } else {
    Result<std::unique_ptr<LocalPool>> pool = import_tensor_table(d, tier, fds, ticket);
    if (!pool) {
      out.message = pool.error().message;
      return out;
    }
    owned = std::move(pool).value();
  }
  // Watch the memory's owner: once it exits, nobody may hold its memory.
  ProcessExitWatch owner;
  if (where != Location::HOST_SEGMENT && d.getOwnerPid() != 0) {
    Result<ProcessExitWatch> watch = ProcessExitWatch::start(d.getOwnerPid());
    if (!watch) {
      out.message =
          fmt::format("the process that allocated the pool (pid {}) has exited", d.getOwnerPid());
      return out;
    }
    owner = std::move(watch).value();
    if (!owner.polling_reason().empty())
      spdlog::info(
          "rank {}: {} (a seccomp filter without it, or a kernel before 5.3): watching pid {}, "
          "the owner of its {} pool, through /proc instead",
          rank_, owner.polling_reason(), owner.pid(), tier == PoolTier::kHost ? "host" : "device");
  }
  // A pool this worker created and the engine's now replaces is nobody's
  // any more: its name goes (the coordinator removes only the pools the
  // directory lists as kvrelay's at shutdown), its memory once unmapped.
  const bool ours =
      control_.pool_directory().slots[rank_][static_cast<uint32_t>(tier)].created_by_kvrelay != 0;
  Result<std::string> replaced = find_pool(control_, rank_, tier);
  publish_pool(control_, rank_, tier, owned->name(), owned->bytes(), false,
               static_cast<PoolLocation>(where), d.getDeviceId());
  if (ours && replaced && *replaced != owned->name()) (void)SharedSegment::unlink(*replaced);
  if (fd_server_) {
    if (where == Location::HOST_SEGMENT) {
      fd_server_->unpublish(tier);
    } else {
      // What a peer asks for: the registration as the engine made it (a
      // RegisterPool, which the peer validates like the coordinator did),
      // and its fds.
      capnp::MallocMessageBuilder msg;
      msg.initRoot<schema::RegisterPool>().setPool(d);
      const kj::Array<capnp::word> words = capnp::messageToFlatArray(msg);
      const kj::ArrayPtr<const kj::byte> bytes = words.asBytes();
      fd_server_->publish(tier, ticket,
                          std::vector<std::byte>(reinterpret_cast<const std::byte*>(bytes.begin()),
                                                 reinterpret_cast<const std::byte*>(bytes.end())),
                          std::move(fds));
    }
  }
  const uint32_t t = static_cast<uint32_t>(tier);
  owner_[t] = std::move(owner);
  return serve(tier, std::move(owned));
}

PoolRegistration DataPlane::serve(PoolTier tier, std::unique_ptr<LocalPool> pool) {
  PoolRegistration out;
  if (tier == PoolTier::kDevice) exited_owner_pid_ = 0;
  swap_.reset();  // it holds the old pools
  // Unpinned while its memory is still mapped: the host pool replaced below
  // is unmapped with it, and cudaHostUnregister of unmapped pages fails (or
  // unpins whatever is mapped there by then).
  pinned_host_.clear();
  if (tier == PoolTier::kDevice) {
    scheduler_.reset();
    transports_.reset();
    device_pool_ = std::move(pool);
    if (Status s = serve_device_pool(); !s) {
      out.broken = true;
      out.message = s.error().message;
      return out;
    }
  } else {
    host_pool_ = std::move(pool);
  }
  start_swap_engine();
  out.registered = true;
  return out;
}

PoolRegistration DataPlane::release_orphaned_pools() {
  PoolRegistration out;
  for (PoolTier tier : {PoolTier::kDevice, PoolTier::kHost}) {
    const uint32_t t = static_cast<uint32_t>(tier);
    if (!owner_[t].exited()) continue;  // the owner lives (or none is watched)
    if (busy()) continue;
    // --pool none: there is nothing of its own to fall back on.
    const bool none = tier == PoolTier::kDevice && control_.config().engine_pools != 0;
    spdlog::warn(
        "rank {}: pid {}, which registered its {} pool {}, exited: letting go of its "
        "memory and {}",
        rank_, owner_[t].pid(), tier == PoolTier::kHost ? "host" : "device",
        (tier == PoolTier::kHost ? host_pool_ : device_pool_)->name(),
        none ? "serving nothing until the engine registers another (--pool none)"
             : "serving a pool of its own");
    const uint32_t exited = owner_[t].pid();
    owner_[t] = ProcessExitWatch();
    if (fd_server_) fd_server_->unpublish(tier);
    if (none) {
      stop_serving();
      exited_owner_pid_ = exited;
      continue;
    }
    Result<std::unique_ptr<LocalPool>> own = open_or_create_pool(control_, rank_, tier);
    if (!own) {
      out.broken = true;
      out.message = fmt::format(
          "the engine that registered its pool exited, and its own pool "
          "cannot be made: {}",
          own.error().message);
      return out;
    }
    out = serve(tier, std::move(own).value());
    if (out.broken) return out;
  }
  return out;
}

bool DataPlane::busy() const {
  return (scheduler_ && scheduler_->live_requests() != 0) || (swap_ && swap_->pending() != 0);
}

void DataPlane::stop_serving() {
  swap_.reset();
  pinned_host_.clear();
  scheduler_.reset();
  transports_.reset();
  device_pool_.reset();
  unpublish_pool(control_, rank_, PoolTier::kDevice);
}

std::string DataPlane::no_pool_reason() const {
  return fmt::format(
      "rank {} has no device pool: the instance runs with --pool none, and the engine has not "
      "registered one{} (register each rank's pool before submitting transfers or swaps)",
      rank_,
      exited_owner_pid_ != 0
          ? fmt::format(" since pid {}, which registered the last one, exited", exited_owner_pid_)
          : "");
}

const LocalPool* DataPlane::truncated_pool() const {
  for (const LocalPool* pool : {device_pool_.get(), host_pool_.get()})
    if (pool != nullptr && pool->truncated()) return pool;
  return nullptr;
}

}  // namespace kvrelay::worker
