// What two rdma peers tell each other over their authenticated control
// connection, in and out of Cap'n Proto: a queue pair's address
// (RdmaQpInfo) and where the accepting side's tensors are (RdmaMemoryRegions).
// A peer's message is untrusted: decoding refuses, with an error naming the
// field, a GID that is not 16 bytes, an MTU that is not 256..4096 and a
// power of two, a QPN or PSN over 24 bits, and regions that do not cover the
// agreed pool geometry exactly (one per tensor of every layer, each the
// tensor's size, none wrapping around the address space).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "instance/pool_geometry.h"
#include "schemas/kvrelay.capnp.h"
#include "shm/result.h"
#include "worker/rdma/queue_pair.h"

namespace kvrelay::worker::rdma {

void encode_endpoint(const QpEndpoint& endpoint, schema::RdmaQpInfo::Builder out);
Result<QpEndpoint> decode_endpoint(schema::RdmaQpInfo::Reader in);

struct RemoteTensor {
  uint64_t address = 0;  // 0: the pool has no such tensor
  // The local registration's key (what a grant hands out where the device
  // has no memory windows). Never sent in an accept: a peer gets keys only
  // in grants, scoped to what they grant.
  uint32_t rkey = 0;
  uint64_t bytes = 0;
};

// A peer's pool as RDMA WRITE targets, checked against the geometry both
// sides agreed on.
// One RdmaMemoryRegions.Region as a peer sent it (unchecked).
struct RegionEntry {
  uint32_t layer = 0;
  uint32_t tensor = 0;
  uint64_t address = 0;
  uint64_t bytes = 0;  // the region's rkey is ignored: keys come in grants
};

class RemoteTensors {
 public:
  // The remote address of `length` bytes at `offset` in (layer, tensor), or
  // kInvalidArgument when they fall outside it. `tensor` is the tensor's slot
  // in a layer (PoolGeometry::slot_of); on the wire, regions name tensors by
  // their ids.
  Result<uint64_t> address(uint32_t layer, uint32_t tensor, uint64_t offset, uint64_t length) const;

 private:
  friend Result<RemoteTensors> check_regions(std::span<const RegionEntry> regions,
                                             const PoolGeometry& geometry);
  struct Span {
    uint64_t address = 0;  // 0: not given (yet)
    uint64_t bytes = 0;
  };
  uint32_t tensors_per_layer_ = 0;
  std::vector<Span> tensors_;  // [layer * tensors_per_layer + tensor]
};

// One region per (layer, tensor) of `geometry`, of `geometry`'s sizes.
void encode_regions(const PoolGeometry& geometry, const std::vector<RemoteTensor>& tensors,
                    schema::RdmaMemoryRegions::Builder out);
Result<RemoteTensors> decode_regions(schema::RdmaMemoryRegions::Reader in,
                                     const PoolGeometry& geometry);
// The regions, copied out unchecked (the control message decoder keeps them
// until the geometry they must match is known).
std::vector<RegionEntry> copy_regions(schema::RdmaMemoryRegions::Reader in);
// Whether `regions` cover `geometry` exactly (see above); the error names the field.
Result<RemoteTensors> check_regions(std::span<const RegionEntry> regions,
                                    const PoolGeometry& geometry);

}  // namespace kvrelay::worker::rdma
