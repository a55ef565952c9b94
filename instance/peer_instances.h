// The other instances on this host that a process talks to (the decode
// instances named by ipc destinations): their control segments, attached
// once and kept while their coordinator lives, judged by its owner lock at
// most every 10 ms. A peer that restarted has a new segment (and epoch),
// which the next lookup attaches afresh; whoever still shares the old
// mapping (a worker's pool writer with writes in flight) keeps it until
// done. The coordinator and the workers both use it.
//
// Not thread-safe: one owner (a process's loop).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "instance/control_segment.h"
#include "shm/liveness.h"
#include "shm/string_key.h"

namespace kvrelay {

class PeerInstances {
 public:
  // The peer's control segment, or why not. A peer already attached is
  // found without allocating (the coordinator's dispatch path).
  Result<const ControlSegment*> get(std::string_view instance);
  // The same mapping, for a holder that may outlive this cache's entry.
  Result<std::shared_ptr<const ControlSegment>> share(std::string_view instance);
  void forget(std::string_view instance) {
    if (auto it = peers_.find(instance); it != peers_.end()) peers_.erase(it);
  }

 private:
  struct Peer {
    std::shared_ptr<const ControlSegment> control;
    std::unique_ptr<CachedPeerJudge> judge;
  };
  StringKeyMap<Peer> peers_;
};

}  // namespace kvrelay
