// A connection's timing from its instance's: heartbeats at its interval,
// and a peer silent for most of its peer timeout is gone.
#pragma once

#include <algorithm>

#include "instance/instance_config.h"
#include "worker/net/channel.h"

namespace kvrelay::worker::net {

inline Timing timing_of(const InstanceConfig& config) {
  Timing t;
  t.heartbeat = std::chrono::milliseconds(config.heartbeat_interval_ms);
  const uint32_t silence = std::max(3 * config.heartbeat_interval_ms,
                                    config.peer_timeout_ms - 2 * config.heartbeat_interval_ms);
  t.peer_timeout = std::chrono::milliseconds(std::min(silence, config.peer_timeout_ms));
  return t;
}

}  // namespace kvrelay::worker::net
