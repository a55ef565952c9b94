#include "worker/pools.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "instance/names.h"
#include "shm/huge_pages.h"

namespace kvrelay::worker {

namespace {

// Which pages back the pool, from the /dev/shm mount (huge_pages.h): one
// line an operator can act on. The mount, not the mapping, is read: the
// mapping's figures (/proc/self/smaps) come from a walk of every page table
// entry of a pool of many GiB, at every worker start.
void log_pool_pages(uint32_t rank, const char* kind, uint64_t bytes) {
  if (bytes < kHugePageBytes) return;
  const std::string huge = tmpfs_huge_option();
  if (huge == "advise" || huge == "always" || huge == "within_size") {
    spdlog::info("rank {}: {} pool on huge pages where the kernel has them (/dev/shm huge={})",
                 rank, kind, huge);
  } else {
    spdlog::info(
        "rank {}: {} pool on 4 KiB pages (/dev/shm huge={}); block copies ran 1.1-1.8x "
        "faster on huge pages in kvrelay's benchmarks: mount /dev/shm with huge=advise "
        "(docs/operating.md)",
        rank, kind, huge.empty() ? "not a tmpfs" : huge);
  }
}

}  // namespace

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
  log_pool_pages(rank, kind, pool->bytes());
  publish_pool(control, rank, tier, name, pool->bytes(), true);
  return std::unique_ptr<LocalPool>(std::make_unique<HostSegmentPool>(std::move(pool).value()));
}

}  // namespace kvrelay::worker
