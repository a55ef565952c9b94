#include "coordinator/rank_health.h"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include "instance/exit_reason.h"
#include "shm/liveness.h"

namespace kvrelay::coordinator {

RankHealth::RankHealth(const ControlSegment& control, const CoordinatorOptions& options,
                       Listener& listener)
    : control_(control),
      options_(options),
      listener_(listener),
      tp_(control.config().tp_size),
      seen_registrations_(tp_, 0),
      lost_(tp_, false) {
  if (!options_.external_workers)
    supervisor_ = std::make_unique<Supervisor>(
        options_.worker_binary.empty() ? default_worker_binary() : options_.worker_binary,
        control_.instance(), tp_, options_.log_dir, options_.log_level, options_.worker_args);
}

Status RankHealth::start() {
  if (supervisor_) return supervisor_->start_all();
  spdlog::info("waiting for {} external kvrelay-worker processes (--instance {})", tp_,
               control_.instance());
  return {};
}

bool RankHealth::wait_ready(Deadline until, const std::function<bool()>& stop,
                            const std::function<void()>& tick) {
  for (;;) {
    tick();
    uint32_t ready = 0;
    for (uint32_t r = 0; r < tp_; ++r)
      ready += read_slot(control_.worker_slot(r)).state == SlotState::kReady ? 1 : 0;
    if (ready == tp_) {
      update_ready_flags();
      return true;
    }
    if (stop()) return false;
    for (uint32_t r = 0; r < tp_; ++r) {
      if (gave_up(r)) {
        spdlog::error("rank {} cannot start; the instance cannot serve without it", r);
        return false;
      }
    }
    if (until.passed()) {
      for (uint32_t r = 0; r < tp_; ++r) {
        if (read_slot(control_.worker_slot(r)).state != SlotState::kReady)
          spdlog::error(
              "rank {} did not become ready within {} ms{}", r, options_.startup_timeout.count(),
              options_.log_dir.empty()
                  ? ""
                  : fmt::format(" (see {}/kvrelay-worker-rank{}.log)", options_.log_dir, r));
      }
      return false;
    }
    supervise(mono_now_ns());
    wait_until(
        control_.status().coordinator_doorbell, [&] { return stop(); },
        Deadline::after(std::chrono::milliseconds(20)));
  }
}

void RankHealth::supervise(uint64_t now_ns) {
  if (supervisor_) {
    // At most every millisecond: the pidfd poll is a system call, which
    // costs ~10 us on the VMs we measure on, and a busy loop turns often.
    if (now_ns >= next_exit_poll_) {
      next_exit_poll_ = now_ns + ns_of(std::chrono::milliseconds(1));
      // Which workers got as far as ready: only starts that fail before it
      // count towards giving a rank up. Read before the exits, so that a
      // worker that got ready and died since the last poll counts as ready
      // (its slot still names it; the pid match keeps out earlier workers).
      for (uint32_t r = 0; r < tp_; ++r) {
        const SlotSnapshot s = read_slot(control_.worker_slot(r));
        if (s.state == SlotState::kReady) supervisor_->note_ready(r, s.owner.pid);
      }
      for (const WorkerExit& e : supervisor_->poll_exits(Deadline::now())) {
        std::string reason = e.reason;
        if (e.exit_code > 0) {
          const std::string why = read_exit_reason(control_.status(), e.rank);
          if (!why.empty()) reason += fmt::format(": {}", why);
        }
        // For kvrelay-dump, until the next start: why the rank is down, and
        // whether it comes back.
        write_exit_reason(
            control_.status(), e.rank,
            fmt::format("{}: {}", e.gave_up ? "not restarted" : "restarting after", reason));
        lost(e.rank, reason, now_ns);
      }
    }
    for (uint32_t rank : supervisor_->restart_due(now_ns)) {
      lost_[rank] = false;
      clear_exit_reason(control_.status(), rank);
      listener_.rank_up(rank);
    }
  } else if (now_ns >= next_external_check_) {
    next_external_check_ = now_ns + ns_of(std::chrono::milliseconds(100));
    for (uint32_t r = 0; r < tp_; ++r) {
      const SlotSnapshot s = read_slot(control_.worker_slot(r));
      if (s.registrations != seen_registrations_[r] && s.state != SlotState::kEmpty) {
        seen_registrations_[r] = s.registrations;
        if (lost_[r]) {
          lost_[r] = false;
          listener_.rank_up(r);
        }
      }
      if (!lost_[r] && s.state != SlotState::kEmpty &&
          judge_peer(s, std::chrono::milliseconds(control_.config().peer_timeout_ms),
                     control_.rank_liveness(r)) == PeerHealth::kDead)
        lost(r, fmt::format("pid {} is gone", s.owner.pid), now_ns);
    }
  }
  update_ready_flags();
}

void RankHealth::lost(uint32_t rank, const std::string& reason, uint64_t now_ns) {
  if (lost_[rank]) return;
  lost_[rank] = true;
  spdlog::error("rank {} lost: {}", rank, reason);
  set_state(control_.worker_slot(rank), SlotState::kEmpty);
  // Before the completions its loss causes: an engine that reads one and
  // looks at the flag must see the rank down.
  update_ready_flags();
  listener_.rank_lost(rank, reason, now_ns);
}

bool RankHealth::stop_rank(uint32_t rank, const std::string& why) {
  if (supervisor_ && supervisor_->pid_of(rank) != 0) {
    spdlog::error("rank {} {}; killing its worker (pid {}) so that it stops writing", rank, why,
                  supervisor_->pid_of(rank));
    kill(static_cast<pid_t>(supervisor_->pid_of(rank)), SIGKILL);
    return true;
  }
  spdlog::error("rank {} {} (an external worker: it cannot be stopped from here)", rank, why);
  return false;
}

bool RankHealth::gave_up(uint32_t rank) const {
  return supervisor_ && supervisor_->gave_up(rank);
}

uint64_t RankHealth::next_due_ns() const {
  return supervisor_ ? supervisor_->next_restart_ns() : next_external_check_;
}

void RankHealth::stop_all(Deadline deadline) {
  if (supervisor_) supervisor_->stop_all(deadline);
}

void RankHealth::update_ready_flags() {
  bool changed = false;
  for (uint32_t r = 0; r < tp_; ++r) {
    const int32_t ready =
        !lost_[r] && read_slot(control_.worker_slot(r)).state == SlotState::kReady ? 1 : 0;
    if (control_.status().ready_flags[r].exchange(ready, std::memory_order_acq_rel) != ready)
      changed = true;
  }
  if (changed) notify_waiters(control_.status().state_changed);
}

}  // namespace kvrelay::coordinator
