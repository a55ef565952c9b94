// Where a request's blocks go: the decode instance's pool for this rank,
// reached through a transport (DESIGN.md section 6). The scheduler decides
// which layer of which blocks to move; a Destination moves them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "schemas/kvrelay.capnp.h"
#include "shm/result.h"
#include "worker/copy_plan.h"

namespace kvrelay::worker {

class Destination {
 public:
  virtual ~Destination() = default;
  // Blocks the destination pool holds in `layer` (for the range check).
  virtual uint32_t blocks_in_layer(uint32_t layer) const = 0;
  // Copies every tensor of `layer` (K, V, and scales) for `runs` from the
  // local pool. Returns the bytes moved.
  virtual Result<uint64_t> copy_layer(uint32_t layer, std::span<const BlockRun> runs) = 0;
  // Makes everything copied so far visible to the destination's readers.
  virtual void fence() = 0;
};

// Resolves a CacheDest (or a ConnectTask's peer) into a Destination.
class DestinationResolver {
 public:
  virtual ~DestinationResolver() = default;
  virtual Result<std::shared_ptr<Destination>> resolve(schema::CacheDest::Reader dest) = 0;
  // For ConnectTask: can this rank reach the peer? ok or why not.
  virtual Status check_connect(schema::ConnectTask::Reader connect) = 0;
};

}  // namespace kvrelay::worker
