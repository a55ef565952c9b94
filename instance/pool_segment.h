// A host-memory KV pool: one shared-memory segment per (instance, rank,
// tier) holding every tensor of PoolGeometry, layer after layer:
//
//   [SegmentPreamble + PoolHeader][layer 0: K | V | K scale | V scale][layer 1 ...]
//
// Each tensor starts on a 4 KiB boundary. The segment is created by the
// rank's worker (the host default; the original's messager allocates its own
// cache) or by the engine, and published in the instance's pool directory so
// that peers (a prefill worker mapping the decode pool) can find it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "instance/control_segment.h"
#include "instance/pool_geometry.h"
#include "instance/segment_header.h"
#include "shm/segment.h"

namespace kvrelay {

struct PoolHeader {
  SegmentPreamble preamble;
  uint32_t rank;
  uint32_t tier;  // PoolTier
  PoolGeometry geometry;
  uint64_t data_offset;
  uint64_t reserved[4];
};
static_assert(sizeof(PoolHeader) == 96 + 8 + 40 + 8 + 32);

class HostPool {
 public:
  static constexpr uint64_t kTensorAlignment = 4096;

  // Creates and publishes nothing: the caller publishes with publish_pool().
  // The creator holds the pool's owner lock (owner_lock.h) while it lives. A
  // segment of the same name whose owner lock is free is replaced, but only
  // if it belongs to this user: another user's segment is never removed.
  static Result<HostPool> create(const std::string& segment_name, uint32_t rank, PoolTier tier,
                                 const PoolGeometry& geometry, const SegmentOptions& options = {});
  // Opens and validates; when `expected` is given, its geometry must match.
  // With `own`, takes the pool's owner lock too (a worker reopening its own
  // rank's pool): kBusy when a live process holds it.
  static Result<HostPool> open(const std::string& segment_name, const PoolGeometry* expected,
                               SegmentAccess access = SegmentAccess::kReadWrite, bool own = false);

  const PoolGeometry& geometry() const { return geometry_; }
  const std::string& name() const { return segment_.name(); }
  uint64_t bytes() const { return segment_.size(); }
  // The whole mapping (header included).
  std::span<std::byte> mapping() const { return {segment_.data(), segment_.size()}; }
  uint32_t rank() const { return rank_; }
  uid_t owner_uid() const { return segment_.owner_uid(); }
  // Whether another process truncated the pool under this mapping: every
  // copy touching it since is garbage (see truncation_guard.h).
  bool truncated() const { return segment_.truncated(); }
  // kCorrupt naming the pool when it was truncated, else ok.
  Status check_intact() const;

  // Base of a tensor; nullptr for a tensor the pool does not have.
  std::byte* tensor(uint32_t layer, PoolTensor t) const;
  // Address of one block; nullptr when layer, tensor or block is out of range.
  std::byte* block(uint32_t layer, PoolTensor t, uint32_t block_id) const;

  Status unlink() const { return SharedSegment::unlink(segment_.name()); }

  static uint64_t segment_bytes(const PoolGeometry& g);

 private:
  // `geometry` and `rank`: copies already validated; the shared header is
  // never read again.
  HostPool(SharedSegment seg, const PoolGeometry& geometry, uint32_t rank);

  SharedSegment segment_;
  PoolGeometry geometry_;
  uint32_t rank_ = 0;
  std::vector<uint64_t> tensor_offsets_;  // [layer * 4 + tensor]
};

// Pool directory (InstanceStatus side): publish / look up where a rank's pool is.
void publish_pool(const ControlSegment& control, uint32_t rank, PoolTier tier,
                  const std::string& segment_name, uint64_t bytes, bool created_by_kvrelay,
                  PoolLocation location = PoolLocation::kHostSegment, uint32_t device_id = 0);
// What the directory says of (rank, tier), read consistently.
struct PublishedPool {
  std::string name;  // the segment's, or the registration's (other locations)
  PoolLocation location = PoolLocation::kHostSegment;
  uint32_t device_id = 0;
  uint64_t bytes = 0;
};
Result<PublishedPool> find_published_pool(const ControlSegment& control, uint32_t rank,
                                          PoolTier tier);
void unpublish_pool(const ControlSegment& control, uint32_t rank, PoolTier tier);
// The segment name published for (rank, tier): kNotFound when none is, and
// kUnsupported when the pool is no host segment (an engine's GPU memory).
Result<std::string> find_pool(const ControlSegment& control, uint32_t rank, PoolTier tier);
// Unlinks every pool segment of this instance that a kvrelay worker created
// (the coordinator, at a clean shutdown). Returns how many were removed.
size_t unlink_kvrelay_pools(const ControlSegment& control);

}  // namespace kvrelay
