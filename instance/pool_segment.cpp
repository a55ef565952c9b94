#include "instance/pool_segment.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <new>

#include "shm/bits.h"
#include "shm/owner_lock.h"
#include "shm/process_identity.h"

namespace kvrelay {

namespace {

std::vector<uint64_t> plan_tensors(const PoolGeometry& g, uint64_t* total) {
  std::vector<uint64_t> offsets(size_t{g.total_layers()} * 4, 0);
  uint64_t cursor = align_up(sizeof(PoolHeader), HostPool::kTensorAlignment);
  for (uint32_t l = 0; l < g.total_layers(); ++l) {
    for (uint32_t slot = 0; slot < g.tensors_per_layer(); ++slot) {
      const PoolTensor t = g.tensor_at(slot);
      offsets[size_t{l} * 4 + static_cast<uint32_t>(t)] = cursor;
      cursor = align_up(cursor + g.tensor_bytes(l, t), HostPool::kTensorAlignment);
    }
  }
  *total = cursor;
  return offsets;
}

Status validate_geometry(const PoolGeometry& g, const std::string& name) {
  if (g.total_layers() == 0 || g.total_layers() > 2048 || g.num_blocks == 0 || g.kv_heads == 0 ||
      g.block_size == 0 || g.head_dim == 0 || g.dtype > static_cast<uint32_t>(CacheDtype::kFp8) ||
      g.has_scales > 1 || g.k_only > 1 || (g.extra_layers > 0 && g.extra_layer_blocks == 0) ||
      g.num_blocks > (1U << 24) || g.extra_layer_blocks > (1U << 24))
    return make_error(Errc::kCorrupt, fmt::format("pool /{} has an impossible geometry", name));
  return {};
}

}  // namespace

uint64_t HostPool::segment_bytes(const PoolGeometry& g) {
  uint64_t total = 0;
  plan_tensors(g, &total);
  return total;
}

HostPool::HostPool(SharedSegment seg, const PoolGeometry& geometry, uint32_t rank)
    : segment_(std::move(seg)), geometry_(geometry), rank_(rank) {
  uint64_t total = 0;
  tensor_offsets_ = plan_tensors(geometry_, &total);
}

Result<HostPool> HostPool::create(const std::string& segment_name, uint32_t rank, PoolTier tier,
                                  const PoolGeometry& geometry, const SegmentOptions& options) {
  if (Status s = validate_geometry(geometry, segment_name); !s)
    return make_error(Errc::kInvalidArgument, s.error().message);
  const uint64_t bytes = segment_bytes(geometry);
  SegmentOptions owned = options;
  owned.owner_lock = true;
  Result<SharedSegment> seg = SharedSegment::create(segment_name, bytes, owned);
  if (!seg && seg.code() == Errc::kAlreadyExists) {
    // Left behind by a dead creator? Then it is ours to replace, if it is ours.
    Result<SharedSegment> old = SharedSegment::open(segment_name, SegmentAccess::kReadOnly);
    if (!old) {
      if (old.code() == Errc::kPermissionDenied)
        return make_error(Errc::kPermissionDenied,
                          fmt::format("pool /{} already exists and belongs to another user; "
                                      "kvrelay never removes another user's segment: remove it "
                                      "as that user, or choose another instance name",
                                      segment_name));
      if (old.code() != Errc::kNotFound) return old.error();
    } else {
      if (old->owner_uid() != geteuid())
        return make_error(Errc::kPermissionDenied,
                          fmt::format("pool /{} already exists and belongs to uid {}; kvrelay "
                                      "never removes another user's segment: remove it as that "
                                      "user, or choose another instance name",
                                      segment_name, old->owner_uid()));
      if (LockSpace{old->fd(), 0}.probe(0) == LockState::kHeld)
        return make_error(Errc::kBusy,
                          fmt::format("pool /{} exists and a live process holds it", segment_name));
      (void)SharedSegment::unlink(segment_name);
    }
    seg = SharedSegment::create(segment_name, bytes, owned);
  }
  if (!seg) return seg.error();
  auto* h = new (seg->data()) PoolHeader{};
  write_preamble(h->preamble, SegmentKind::kPool, bytes);
  h->rank = rank;
  h->tier = static_cast<uint32_t>(tier);
  h->geometry = geometry;
  h->data_offset = align_up(sizeof(PoolHeader), kTensorAlignment);
  h->preamble.magic.store(kSegmentMagic, std::memory_order_release);
  return HostPool(std::move(seg).value(), geometry, rank);
}

Result<HostPool> HostPool::open(const std::string& segment_name, const PoolGeometry* expected,
                                SegmentAccess access, bool own) {
  Result<SharedSegment> seg = SharedSegment::open(segment_name, access);
  if (!seg) return seg.error();
  if (own && !LockSpace{seg->fd(), 0}.try_lock(0))
    return make_error(Errc::kBusy, fmt::format("pool /{} is held by another live process (another "
                                               "worker of the same rank?)",
                                               segment_name));
  if (Status s =
          validate_preamble(seg->data(), seg->size(), segment_name, SegmentKind::kPool, false);
      !s)
    return s.error();
  if (seg->size() < sizeof(PoolHeader))
    return make_error(Errc::kSizeMismatch, fmt::format("pool /{} is too small", segment_name));
  // Copy, then validate the copy: the header may change under us.
  PoolHeader h{};
  std::memcpy(static_cast<void*>(&h), seg->data(), sizeof(h));
  if (Status s = validate_geometry(h.geometry, segment_name); !s) return s.error();
  if (segment_bytes(h.geometry) != seg->size())
    return make_error(Errc::kSizeMismatch,
                      fmt::format("pool /{} is {} bytes, its geometry needs {}", segment_name,
                                  seg->size(), segment_bytes(h.geometry)));
  if (expected != nullptr && !(h.geometry == *expected))
    return make_error(
        Errc::kLayoutMismatch,
        fmt::format(
            "pool /{} has geometry layers {}+{} blocks {} heads {} block_size {} head_dim {} "
            "dtype {} scales {}{}, expected layers {}+{} blocks {} heads {} block_size {} "
            "head_dim {} dtype {} scales {}{}",
            segment_name, h.geometry.num_layers, h.geometry.extra_layers, h.geometry.num_blocks,
            h.geometry.kv_heads, h.geometry.block_size, h.geometry.head_dim, h.geometry.dtype,
            h.geometry.has_scales, h.geometry.k_only != 0 ? " K only" : "", expected->num_layers, expected->extra_layers,
            expected->num_blocks, expected->kv_heads, expected->block_size, expected->head_dim,
            expected->dtype, expected->has_scales, expected->k_only != 0 ? " K only" : ""));
  return HostPool(std::move(seg).value(), h.geometry, h.rank);
}

Status HostPool::check_intact() const {
  if (!truncated()) return {};
  return make_error(Errc::kCorrupt,
                    fmt::format("pool /{} was truncated by another process (it had {} bytes); "
                                "what was copied from or into it since is lost",
                                name(), bytes()));
}

std::byte* HostPool::tensor(uint32_t layer, PoolTensor t) const {
  if (layer >= geometry_.total_layers() || !geometry_.has_tensor(t)) return nullptr;
  return segment_.data() + tensor_offsets_[size_t{layer} * 4 + static_cast<uint32_t>(t)];
}

std::byte* HostPool::block(uint32_t layer, PoolTensor t, uint32_t block_id) const {
  std::byte* base = tensor(layer, t);
  if (base == nullptr || block_id >= geometry_.blocks_in_layer(layer)) return nullptr;
  return base + uint64_t{block_id} * geometry_.block_bytes(t);
}

void publish_pool(const ControlSegment& control, uint32_t rank, PoolTier tier,
                  const std::string& segment_name, uint64_t bytes, bool created_by_kvrelay,
                  PoolLocation location, uint32_t device_id) {
  PoolSlot& slot = control.pool_directory().slots[rank][static_cast<uint32_t>(tier)];
  const uint32_t seq = slot.sequence.load(std::memory_order_relaxed);
  slot.sequence.store(seq | 1U, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  std::memset(slot.segment_name, 0, sizeof(slot.segment_name));
  std::memcpy(slot.segment_name, segment_name.data(),
              std::min(segment_name.size(), sizeof(slot.segment_name) - 1));
  slot.location = static_cast<uint32_t>(location);
  slot.device_id = device_id;
  slot.pool_bytes = bytes;
  slot.publisher_pid = self_pid();
  slot.created_by_kvrelay = created_by_kvrelay ? 1 : 0;
  slot.sequence.store((seq | 1U) + 1, std::memory_order_release);
}

void unpublish_pool(const ControlSegment& control, uint32_t rank, PoolTier tier) {
  PoolSlot& slot = control.pool_directory().slots[rank][static_cast<uint32_t>(tier)];
  const uint32_t seq = slot.sequence.load(std::memory_order_relaxed);
  slot.sequence.store(seq | 1U, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  std::memset(slot.segment_name, 0, sizeof(slot.segment_name));
  slot.location = static_cast<uint32_t>(PoolLocation::kHostSegment);
  slot.pool_bytes = 0;
  slot.sequence.store((seq | 1U) + 1, std::memory_order_release);
}

Result<PublishedPool> find_published_pool(const ControlSegment& control, uint32_t rank,
                                          PoolTier tier) {
  if (rank >= control.config().tp_size || static_cast<uint32_t>(tier) >= kPoolTiers)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("no rank {} in instance '{}'", rank, control.instance()));
  const PoolSlot& slot = control.pool_directory().slots[rank][static_cast<uint32_t>(tier)];
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const uint32_t before = slot.sequence.load(std::memory_order_acquire);
    if ((before & 1U) != 0) continue;
    char name[kPoolNameBytes];
    std::memcpy(name, slot.segment_name, sizeof(name));
    PublishedPool p;
    p.location = static_cast<PoolLocation>(slot.location);
    p.device_id = slot.device_id;
    p.bytes = slot.pool_bytes;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.sequence.load(std::memory_order_relaxed) != before) continue;
    name[sizeof(name) - 1] = '\0';
    if (name[0] == '\0')
      return make_error(
          Errc::kNotFound,
          fmt::format("instance '{}' has published no {} pool for rank {}{}", control.instance(),
                      tier == PoolTier::kHost ? "host" : "device", rank,
                      tier == PoolTier::kDevice && control.config().engine_pools != 0
                          ? " (it runs with --pool none: the engine registers its own)"
                          : ""));
    if (static_cast<uint32_t>(p.location) > static_cast<uint32_t>(PoolLocation::kHostFd))
      return make_error(Errc::kCorrupt,
                        fmt::format("instance '{}' rank {}: the pool directory names location {}",
                                    control.instance(), rank, slot.location));
    p.name = name;
    return p;
  }
  return make_error(Errc::kNotReady, "pool directory entry kept changing");
}

Result<std::string> find_pool(const ControlSegment& control, uint32_t rank, PoolTier tier) {
  Result<PublishedPool> p = find_published_pool(control, rank, tier);
  if (!p) return p.error();
  if (p->location != PoolLocation::kHostSegment)
    return make_error(Errc::kUnsupported,
                      fmt::format("instance '{}' rank {}'s {} pool is memory its engine "
                                  "registered ({}), not a host segment",
                                  control.instance(), rank,
                                  tier == PoolTier::kHost ? "host" : "device", p->name));
  return std::move(p->name);
}

}  // namespace kvrelay

namespace kvrelay {

size_t unlink_kvrelay_pools(const ControlSegment& control) {
  size_t removed = 0;
  for (uint32_t rank = 0; rank < control.config().tp_size; ++rank) {
    for (uint32_t tier = 0; tier < kPoolTiers; ++tier) {
      const PoolSlot& slot = control.pool_directory().slots[rank][tier];
      if (slot.created_by_kvrelay == 0) continue;
      Result<std::string> name = find_pool(control, rank, static_cast<PoolTier>(tier));
      if (name && SharedSegment::unlink(*name).ok()) ++removed;
      unpublish_pool(control, rank, static_cast<PoolTier>(tier));
    }
  }
  return removed;
}

}  // namespace kvrelay
