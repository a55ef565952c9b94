// iperf3 between the tcp bench's two hosts: the limit of the path itself
// (bulk streams, no framing, nothing landed anywhere), the second baseline of
// kvrelay-bench-tcp beside its plain framed socket.
#pragma once

#include <cstdint>
#include <string>

#include "two_hosts.h"

namespace kvrelay::bench {

struct Iperf3Result {
  double gbps = 0;      // payload GB/s the server received, all streams together
  std::string why_not;  // set when there is no figure: not installed, failed
};

// Runs `iperf3 -s -1` on host B and `iperf3 -c` with `streams` parallel
// streams for `seconds` on host A. iperf3 is an optional tool: its absence is
// a reason in the result, not an error.
Iperf3Result run_iperf3(const sim::TwoHosts& hosts, uint32_t streams, int seconds);

}  // namespace kvrelay::bench
