// The other instances on this host that a process talks to (the decode
// instances named by ipc destinations): their control segments, attached
// once and kept while their coordinator lives, judged by its owner lock at
// most every 10 ms. A peer that restarted has a new segment (and epoch),
// which the next lookup attaches afresh; whoever still shares the old
// mapping (a worker's intake writer with writes in flight) keeps it until
// done. The coordinator and the workers both use it.
//
// Not thread-safe: one owner (a process's loop).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "instance/control_segment.h"
#include "shm/liveness.h"

namespace kvrelay {

class PeerInstances {
 public:
  // The peer's control segment, or why not.
  Result<const ControlSegment*> get(const std::string& instance);
  // The same mapping, for a holder that may outlive this cache's entry.
  Result<std::shared_ptr<const ControlSegment>> share(const std::string& instance);
  void forget(const std::string& instance) { peers_.erase(instance); }

 private:
  struct Peer {
    std::shared_ptr<const ControlSegment> control;
    std::unique_ptr<CachedPeerJudge> judge;
  };
  std::unordered_map<std::string, Peer> peers_;
};

}  // namespace kvrelay
