#include "coordinator/shared_state_guard.h"

#include <spdlog/spdlog.h>

#include "coordinator/coordinator_counters.h"
#include "shm/liveness.h"
#include "shm/process_identity.h"

namespace kvrelay::coordinator {

namespace {
constexpr Nanos kCheckEvery = std::chrono::milliseconds(10);
constexpr const char* kTruncated = "its control segment was truncated by another process";
}  // namespace

SharedStateGuard::SharedStateGuard(const ControlSegment& control, CountersBlock& counters)
    : control_(control), counters_(counters), last_report_repairs_(control.config().tp_size, 0) {}

std::optional<std::string> SharedStateGuard::check(uint64_t now, InstanceState state,
                                                   CoordinatorRings rings) {
  if (control_.segment().truncated()) return kTruncated;  // nothing shared can be trusted
  if (now < next_check_ns_) return std::nullopt;
  next_check_ns_ = now + ns_of(kCheckEvery);
  CounterWriter counters(counters_);
  if (control_.header().state.load(std::memory_order_acquire) != static_cast<uint32_t>(state)) {
    spdlog::error(
        "the instance state in the segment header was overwritten (with {}); "
        "restored to {}",
        control_.header().state.load(), instance_state_name(static_cast<uint32_t>(state)));
    control_.set_state(state);
    counters.add(kSharedStateRepairs);
  }
  const SlotSnapshot me = read_slot(control_.coordinator_slot());
  if ((me.owner.pid != self_pid() || me.state != SlotState::kReady) &&
      state != InstanceState::kInitialising) {
    spdlog::error("the coordinator's liveness slot was overwritten (pid {}); restored",
                  me.owner.pid);
    register_self(control_.coordinator_slot(), SlotState::kReady);
    counters.add(kSharedStateRepairs);
  }
  if (auto what = rings.submit.take_corruption()) {
    spdlog::error("submit ring: {}", *what);
    counters.add(kSharedStateRepairs);
  }
  if (auto what = rings.completions.producer().take_corruption()) {
    spdlog::error("completion ring: {}", *what);
    counters.add(kSharedStateRepairs);
  }
  for (uint32_t r = 0; r < rings.tasks.size(); ++r) {
    if (auto what = rings.tasks[r].producer().take_corruption()) {
      spdlog::error("task ring of rank {}: {}", r, *what);
      counters.add(kSharedStateRepairs);
    }
  }
  for (uint32_t r = 0; r < rings.reports.size() && r < last_report_repairs_.size(); ++r) {
    const uint64_t repairs =
        rings.reports[r].header().corrupt_events.load(std::memory_order_relaxed);
    if (repairs != last_report_repairs_[r]) {
      spdlog::error("report ring of rank {}: its shared state was overwritten ({} repairs)", r,
                    repairs - last_report_repairs_[r]);
      last_report_repairs_[r] = repairs;
      counters.add(kSharedStateRepairs);
    }
  }
  if (control_.segment().truncated()) return kTruncated;
  if (rings.submit.corrupt())
    return "the submit ring holds records whose boundaries cannot be trusted (written by a "
           "process that bypassed the client library)";
  if (rings.completions.producer().ring().corrupt())
    return "the completion ring's reader found records whose boundaries cannot be trusted";
  return std::nullopt;
}

}  // namespace kvrelay::coordinator
