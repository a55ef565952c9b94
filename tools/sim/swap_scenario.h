// kvrelay-sim --swap: the transfer manager's scenario on one instance with a
// host tier. Each round fills some device blocks, evicts them to host blocks,
// overwrites the device blocks, then loads them back layer by layer while a
// simulated forward pass waits on each layer in turn (Client::wait_layer) and
// checks that layer's bytes the moment it is reported ready.
#pragma once

#include <cstdint>
#include <string>

#include "kvrelay/client.h"
#include "shm/counters.h"

namespace kvrelay::sim {

struct SwapOptions {
  uint32_t rounds = 64;
  uint32_t max_blocks = 32;  // blocks per swap: 1..max_blocks
  uint64_t seed = 1;
};

struct SwapReportSummary {
  uint32_t rounds = 0;
  uint32_t failed = 0;
  uint64_t bytes = 0;     // evicted + loaded
  double evict_gbps = 0;  // bytes / time from submit to completion, p50 over rounds
  double load_gbps = 0;
  Quantiles first_layer_ready;  // ns: load submitted -> layer 0 usable
  Quantiles all_layers_ready;   // ns: load submitted -> last layer usable
  uint64_t wrong_words = 0;
  std::string first_error;
  bool ok() const { return failed == 0 && wrong_words == 0 && rounds > 0; }
  std::string summary() const;
};

SwapReportSummary run_swap_scenario(const SwapOptions& options, Client& client);

}  // namespace kvrelay::sim
