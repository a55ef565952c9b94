#include "worker/stall_watch.h"

#include <spdlog/spdlog.h>

namespace kvrelay::worker {

bool StallWatch::check(SendScheduler& scheduler, uint64_t now_ns) {
  if (now_ns < next_check_ns_) return false;
  next_check_ns_ = now_ns + ns_of(std::chrono::seconds(1));
  scheduler.find_stalls(now_ns, report_after_ns_, stalls_);
  if (stalls_.empty() && !listed_any_) return false;
  const uint64_t found_before = found_;
  records_.clear();
  for (const SendScheduler::Stall& s : stalls_) {
    if (s.first_time) {
      ++found_;
      const double seconds = static_cast<double>(now_ns - s.since_ns) / 1e9;
      spdlog::warn(
          "rank {}: request '{}' (engine slot {}) has not finished {:.1f} s after {}: {}{}", rank_,
          *s.id, s.slot, seconds,
          s.reason == StallReason::kWithdrawing ? "it ended" : "its final chunk was signalled here",
          stall_reason_text(s.reason),
          s.in_flight != 0 && s.peer != nullptr
              ? fmt::format(" ({} transfers in flight to {})", s.in_flight, *s.peer)
              : std::string());
    }
    StallRecord r;
    r.since_ns = s.since_ns;
    r.slot = s.slot;
    r.reason = static_cast<uint32_t>(s.reason);
    r.in_flight = s.in_flight;
    request_stalls::set_text(r.request_id, *s.id);
    if (s.peer != nullptr) request_stalls::set_text(r.peer, *s.peer);
    records_.push_back(r);
  }
  listed_any_ = !records_.empty();
  if (found_ != found_before) return true;  // published after the counter is mirrored
  request_stalls::publish(board_, records_);
  return false;
}

void StallWatch::publish() {
  request_stalls::publish(board_, records_);
}

}  // namespace kvrelay::worker
