// Where a request's time goes, hop by hop: the hop histograms the
// coordinator, the workers and the clients keep in shared memory
// (docs/latency.md), read around each measured request only, so that
// warm-up and set-up traffic stay out of the figures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "instance/control_segment.h"
#include "shm/counters.h"

namespace kvrelay::bench {

struct Hop {
  enum class Where { kCoordinator, kWorkers, kClients };
  std::string name;
  Where where;
  uint32_t histogram;
};

// Engine submit -> coordinator -> worker -> copy start.
std::vector<Hop> dispatch_hops();
// Last layer signal read -> copy done -> report -> coordinator -> completion -> engine read.
std::vector<Hop> completion_hops();

class HopBreakdown {
 public:
  HopBreakdown(const ControlSegment& control, std::vector<Hop> hops);
  void begin();  // before a measured request
  void end();    // after it: what it added is kept
  // Prints each hop's p50 and p99 (us) and emits them for the report.
  void print(const std::string& title) const;

 private:
  HistogramSnapshot read(const Hop& hop) const;
  const ControlSegment& control_;
  std::vector<Hop> hops_;
  std::vector<HistogramSnapshot> before_, kept_;
};

}  // namespace kvrelay::bench
