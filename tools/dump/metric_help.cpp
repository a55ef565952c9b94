#include "metric_help.h"

#include <fmt/format.h>

#include <array>
#include <span>
#include <utility>

#include "coordinator/coordinator_counters.h"
#include "instance/control_layout.h"
#include "worker/worker_counters.h"

namespace kvrelay::dump {

namespace {

const char* help_of(std::span<const char* const> labels, std::span<const char* const> help,
                 std::string_view label) {
  for (size_t i = 0; i < labels.size() && i < help.size(); ++i)
    if (label == labels[i]) return help[i];
  return nullptr;
}

template <size_t N>
std::array<const char*, N> names(const std::pair<const char*, const char*> (&labels)[N]) {
  std::array<const char*, N> out{};
  for (size_t i = 0; i < N; ++i) out[i] = labels[i].first;
  return out;
}

}  // namespace

std::string metric_help(std::string_view block, std::string_view label, bool histogram) {
  const char* text = nullptr;
  if (block == "worker") {
    text = histogram ? help_of(names(worker::kWorkerHistogramLabels), worker::kWorkerHistogramHelp, label)
                     : help_of(worker::kWorkerCounterLabels, worker::kWorkerCounterHelp, label);
  } else if (block == "coordinator") {
    text = histogram ? help_of(names(coordinator::kCoordinatorHistogramLabels),
                            coordinator::kCoordinatorHistogramHelp, label)
                     : help_of(coordinator::kCoordinatorCounterLabels,
                            coordinator::kCoordinatorCounterHelp, label);
  } else if (block == "clients" && histogram) {
    text = help_of(names(kClientHistogramLabels), kClientHistogramHelp, label);
  }
  if (text != nullptr) return text;
  return fmt::format("kvrelay {} {} '{}'", block, histogram ? "histogram" : "counter", label);
}

}  // namespace kvrelay::dump
