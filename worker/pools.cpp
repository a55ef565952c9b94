#include "worker/pools.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "instance/names.h"

namespace kvrelay::worker {

Result<std::unique_ptr<LocalPool>> open_or_create_pool(const ControlSegment& control, uint32_t rank,
                                                       PoolTier tier) {
  const PoolGeometry geometry = pool_geometry_of(control.config(), tier);
  const char* kind = tier == PoolTier::kHost ? "host" : "device";
  const std::string name =
      pool_segment_name(control.instance(), tier == PoolTier::kHost ? "host" : "pool", rank);
  Result<HostPool> pool = HostPool::open(name, &geometry, SegmentAccess::kReadWrite, true);
  if (pool) {
    spdlog::info("rank {}: reusing {} pool /{} ({} MiB)", rank, kind, name, pool->bytes() >> 20);
  } else {
    switch (pool.code()) {
      case Errc::kNotFound: break;
      case Errc::kPermissionDenied:
      case Errc::kBusy:
        // Not ours to replace: another user's segment, or a live process's.
        return make_error(pool.code(), fmt::format("{} pool: {}", kind, pool.error().message));
      default:
        spdlog::warn("rank {}: replacing {} pool /{}: {}", rank, kind, name, pool.error().message);
        (void)SharedSegment::unlink(name);
    }
    SegmentOptions options;
    options.group_access = control.config().group_access != 0;
    pool = HostPool::create(name, rank, tier, geometry, options);
    if (!pool) return pool.error();
    spdlog::info("rank {}: created {} pool /{} ({} MiB)", rank, kind, name, pool->bytes() >> 20);
  }
  publish_pool(control, rank, tier, name, pool->bytes(), true);
  return std::unique_ptr<LocalPool>(std::make_unique<HostSegmentPool>(std::move(pool).value()));
}

}  // namespace kvrelay::worker
