// kvrelay-dump --prometheus: an instance's counters and histograms in the
// Prometheus text exposition format (version 0.0.4), for a scraper.
//
//   kvrelay_coordinator_<counter>_total{instance,role}        counters
//   kvrelay_worker_<counter>_total{instance,role,rank}
//   kvrelay_..._<histogram>_{seconds,bytes,...}_bucket{...,le} histograms (cumulative
//                                                              log2 buckets, _sum, _count)
//   kvrelay_instance_ready, kvrelay_worker_ready{rank},       gauges from the instance's state
//   kvrelay_ring_fill_ratio{ring}, kvrelay_ring_full_events_total{ring},
//   and the coordinator's live request and remembered-id counts (gauges)
//
// Durations are exported in seconds (the histograms count nanoseconds).
#pragma once

#include <string>

#include "instance_view.h"

namespace kvrelay::dump {

std::string render_prometheus(const ControlSegment& control, const InstanceView& view);

}  // namespace kvrelay::dump
