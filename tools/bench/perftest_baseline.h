// rdma-core's perftest (ib_write_bw) on the rdma bench's device: the limit of
// the device itself for RDMA WRITEs of one block's size over as many queue
// pairs, the baseline of kvrelay-bench-rdma.
#pragma once

#include <cstdint>
#include <string>

#include "shm/result.h"

namespace kvrelay::bench {

struct PerftestRun {
  std::string device;  // as ibv_devices names it
  int gid_index = 1;
  uint32_t queue_pairs = 1;
  uint64_t message_bytes = 0;
  uint64_t iterations = 0;
};

// ib_write_bw's average MB/s (10^6 bytes) between a server and a client on
// this host, or why there is no figure. Never waits without end: perftest's
// server waits for one client forever, and its client tries to connect once.
Result<double> run_ib_write_bw(const PerftestRun& run);

}  // namespace kvrelay::bench
