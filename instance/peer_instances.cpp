#include "instance/peer_instances.h"

#include <fmt/format.h>

namespace kvrelay {

Result<const ControlSegment*> PeerInstances::get(std::string_view instance) {
  Result<std::shared_ptr<const ControlSegment>> shared = share(instance);
  if (!shared) return shared.error();
  return shared->get();
}

Result<std::shared_ptr<const ControlSegment>> PeerInstances::share(std::string_view instance) {
  auto it = peers_.find(instance);
  if (it != peers_.end()) {
    if (it->second.judge->lock_state() != LockState::kFree) return it->second.control;
    peers_.erase(it);  // its coordinator is gone; a successor has a new segment
  }
  Result<ControlSegment> c = ControlSegment::attach(instance);
  if (!c) return make_error(c.code(), fmt::format("peer instance: {}", c.error().message));
  Peer peer;
  peer.control = std::make_shared<const ControlSegment>(std::move(c).value());
  peer.judge = std::make_unique<CachedPeerJudge>(peer.control->locks());
  std::shared_ptr<const ControlSegment> out = peer.control;
  peers_.insert_or_assign(std::string(instance), std::move(peer));
  return out;
}

}  // namespace kvrelay
