#include "instance/peer_instances.h"

#include <fmt/format.h>

namespace kvrelay {

Result<const ControlSegment*> PeerInstances::get(const std::string& instance) {
  auto it = peers_.find(instance);
  if (it != peers_.end()) {
    if (it->second.judge->lock_state() != LockState::kFree) return it->second.control.get();
    peers_.erase(it);  // its coordinator is gone; a successor has a new segment
  }
  Result<ControlSegment> c = ControlSegment::attach(instance);
  if (!c) return make_error(c.code(), fmt::format("peer instance: {}", c.error().message));
  Peer peer;
  peer.control = std::make_unique<ControlSegment>(std::move(c).value());
  peer.judge = std::make_unique<CachedPeerJudge>(peer.control->locks());
  const ControlSegment* out = peer.control.get();
  peers_[instance] = std::move(peer);
  return out;
}

}  // namespace kvrelay
