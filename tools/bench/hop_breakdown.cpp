#include "hop_breakdown.h"

#include <fmt/format.h>

#include "bench_support.h"
#include "coordinator/coordinator_counters.h"
#include "instance/control_layout.h"
#include "worker/worker_counters.h"

namespace kvrelay::bench {

using Where = Hop::Where;

std::vector<Hop> dispatch_hops() {
  return {{"engine submit -> coordinator read", Where::kCoordinator, coordinator::kSubmitToReadNs},
          {"coordinator read -> task written", Where::kCoordinator,
           coordinator::kReadToTaskWrittenNs},
          {"task written -> worker read", Where::kWorkers, worker::kTaskWrittenToReadNs},
          {"worker read -> copy start", Where::kWorkers, worker::kDestReadToCopyNs}};
}

std::vector<Hop> completion_hops() {
  return {{"layer signal pushed -> worker read", Where::kWorkers, worker::kSignalWrittenToReadNs},
          {"layer signal read -> copy done", Where::kWorkers, worker::kSignalToCopyDoneNs},
          {"copy done -> report written", Where::kWorkers, worker::kCopyDoneToReportNs},
          {"report written -> coordinator read", Where::kCoordinator,
           coordinator::kReportWrittenToReadNs},
          {"coordinator read -> completion written", Where::kCoordinator,
           coordinator::kReportReadToCompletionNs},
          {"completion written -> engine read", Where::kClients, kCompletionWrittenToEngineReadNs}};
}

HopBreakdown::HopBreakdown(const ControlSegment& control, std::vector<Hop> hops)
    : control_(control), hops_(std::move(hops)), before_(hops_.size()), kept_(hops_.size()) {}

HistogramSnapshot HopBreakdown::read(const Hop& hop) const {
  switch (hop.where) {
    case Where::kCoordinator:
      return snapshot_histogram(control_.counters(kCoordinatorCounters), hop.histogram);
    case Where::kClients:
      return snapshot_histogram(control_.counters(kClientCounters), hop.histogram);
    case Where::kWorkers: break;
  }
  HistogramSnapshot merged;
  for (uint32_t r = 0; r < control_.config().tp_size; ++r)
    merged.merge(snapshot_histogram(control_.counters(worker_counters_index(r)), hop.histogram));
  return merged;
}

void HopBreakdown::begin() {
  for (size_t i = 0; i < hops_.size(); ++i)
    before_[i] = read(hops_[i]);
}

void HopBreakdown::end() {
  for (size_t i = 0; i < hops_.size(); ++i) {
    HistogramSnapshot added = read(hops_[i]);
    added.subtract(before_[i]);
    kept_[i].merge(added);
  }
}

void HopBreakdown::print(const std::string& title) const {
  std::printf("%s, hop by hop (every rank's samples; within 1.6%%):\n", title.c_str());
  std::string note = title + ", hop by hop (us, p50 / p99):";
  for (size_t i = 0; i < hops_.size(); ++i) {
    const Quantiles q = quantiles_of(kept_[i]);
    std::printf("  %-42s n=%-6lu p50 %9.1f us  p99 %9.1f us\n", hops_[i].name.c_str(),
                static_cast<unsigned long>(q.count), q.p50 / 1e3, q.p99 / 1e3);
    note += fmt::format("{} {} {:.1f} / {:.1f}", i == 0 ? "" : ";", hops_[i].name, q.p50 / 1e3,
                        q.p99 / 1e3);
  }
  std::fflush(stdout);
  print_note(note);
}

}  // namespace kvrelay::bench
