#include "coordinator/engine_sessions.h"

#include "schemas/records.h"

namespace kvrelay::coordinator {

namespace {
constexpr Nanos kPollInterval = std::chrono::milliseconds(10);
}  // namespace

void EngineSessions::seen(uint32_t slot, uint16_t generation) {
  auto [it, inserted] = tracked_.try_emplace(slot, generation);
  if (inserted || it->second == generation) return;
  // The slot was leased again: its previous session ended.
  const bool died = submit_.session_state(slot, it->second) == ProducerSession::kDead;
  ended_.push_back(Ended{records::session_id(slot, it->second), died});
  it->second = generation;
}

void EngineSessions::hello(uint32_t slot, uint16_t generation) {
  seen(slot, generation);
  pending_hellos_.emplace_back(slot, generation);
}

std::vector<EngineSessions::Ended> EngineSessions::poll(uint64_t now_ns, bool force) {
  std::vector<Ended> out = std::move(ended_);
  ended_.clear();
  if (!force && pending_hellos_.empty() && now_ns < next_poll_ns_) return out;
  next_poll_ns_ = now_ns + ns_of(kPollInterval);
  for (auto it = tracked_.begin(); it != tracked_.end();) {
    const ProducerSession state = submit_.session_state(it->first, it->second);
    if (state == ProducerSession::kAlive) {
      ++it;
      continue;
    }
    out.push_back(
        Ended{records::session_id(it->first, it->second), state == ProducerSession::kDead});
    it = tracked_.erase(it);
  }
  return out;
}

bool EngineSessions::acknowledge_pending() {
  if (pending_hellos_.empty()) return false;
  for (const auto& [slot, generation] : pending_hellos_)
    submit_.acknowledge(slot, generation);
  pending_hellos_.clear();
  return true;
}

}  // namespace kvrelay::coordinator
