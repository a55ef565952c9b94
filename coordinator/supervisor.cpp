#include "coordinator/supervisor.h"

#include <fmt/format.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "shm/spawn.h"

namespace kvrelay::coordinator {

namespace {
// Backoff after a crash: 100 ms, doubling, at most 5 s; a worker that stayed
// up for 10 s starts again from 100 ms.
constexpr Nanos kFirstBackoff = std::chrono::milliseconds(100);
constexpr Nanos kMaxBackoff = std::chrono::seconds(5);
constexpr Nanos kHealthyRun = std::chrono::seconds(10);
}  // namespace

std::string default_worker_binary() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "kvrelay-worker";
  return (self.parent_path() / "kvrelay-worker").string();
}

Supervisor::Supervisor(std::string worker_binary, std::string instance, uint32_t tp_size,
                       std::string log_dir, std::string log_level,
                       std::vector<std::string> worker_args)
    : worker_binary_(std::move(worker_binary)),
      instance_(std::move(instance)),
      log_dir_(std::move(log_dir)),
      log_level_(std::move(log_level)),
      worker_args_(std::move(worker_args)),
      ranks_(tp_size) {}

Supervisor::~Supervisor() {
  if (!stopping_) stop_all(Deadline::after(std::chrono::seconds(5)));
}

Status Supervisor::spawn(uint32_t rank) {
  std::vector<std::string> args = {worker_binary_,       "--instance",  instance_, "--rank",
                                   std::to_string(rank), "--log-level", log_level_};
  if (!log_dir_.empty()) {
    args.push_back("--log-dir");
    args.push_back(log_dir_);
  }
  args.insert(args.end(), worker_args_.begin(), worker_args_.end());
  SpawnOptions spawn;
  spawn.die_with_parent = true;
  // Ctrl-C in a terminal signals the coordinator's whole process group. Its
  // workers must not stop on it: the coordinator drains first (requests in
  // flight finish on the workers), then stops them. Were they in its group,
  // they would exit at once, and every request in flight would fail as if
  // its ranks had died.
  spawn.own_process_group = true;
  Result<pid_t> pid = spawn_process(args, spawn);
  if (!pid) return pid.error();
  Rank& r = ranks_[rank];
  r.pid = static_cast<uint32_t>(*pid);
  r.started_ns = mono_now_ns();
  r.restart_at_ns = 0;
  r.ready = false;
  if (Status s = watcher_.watch(r.pid); !s) return s;
  if (!told_polling_ && !watcher_.polling_reason().empty()) {
    told_polling_ = true;
    spdlog::warn(
        "{} (a seccomp filter without it, or a kernel before 5.3): watching the workers by "
        "polling their exits every {} ms instead",
        watcher_.polling_reason(),
        std::chrono::duration_cast<std::chrono::milliseconds>(PidfdWatcher::kPollEvery).count());
  }
  spdlog::info("started rank {} worker, pid {}", rank, *pid);
  return {};
}

Status Supervisor::start_all() {
  for (uint32_t rank = 0; rank < ranks_.size(); ++rank) {
    if (Status s = spawn(rank); !s) return s;
  }
  return {};
}

std::vector<WorkerExit> Supervisor::poll_exits(Deadline deadline) {
  std::vector<WorkerExit> out;
  for (const PidfdWatcher::Exit& e : watcher_.wait(deadline)) {
    auto it =
        std::find_if(ranks_.begin(), ranks_.end(), [&](const Rank& r) { return r.pid == e.pid; });
    if (it == ranks_.end()) continue;
    const auto rank = static_cast<uint32_t>(it - ranks_.begin());
    Rank& r = *it;
    const uint64_t now = mono_now_ns();
    r.pid = 0;
    WorkerExit exit{rank, e.pid, e.describe(), e.signal == 0 ? e.exit_code : -1, false};
    if (!stopping_) {
      const bool short_run = now - r.started_ns <= ns_of(kHealthyRun);
      r.consecutive_failures = short_run ? r.consecutive_failures + 1 : 1;
      r.failed_starts = r.ready ? 0 : r.failed_starts + 1;
      const bool same = exit.reason == r.last_failure;
      r.last_failure = exit.reason;
      if (exit.exit_code == kWorkerExitRefused || (same && r.failed_starts >= kGiveUpAfter)) {
        r.gave_up = true;
        exit.gave_up = true;
        spdlog::error("rank {} worker (pid {}) {}; not restarting it{}", rank, e.pid, exit.reason,
                      exit.exit_code == kWorkerExitRefused
                          ? ": it cannot start here (see why above)"
                          : fmt::format(": it failed the same way {} times in a row "
                                        "before it was ready",
                                        r.failed_starts));
      } else {
        const Nanos backoff = std::min(
            kMaxBackoff, kFirstBackoff * (1U << std::min(r.consecutive_failures - 1, 10U)));
        r.restart_at_ns = now + ns_of(backoff);
        spdlog::error("rank {} worker (pid {}) died: {}; restarting in {} ms", rank, e.pid,
                      exit.reason,
                      std::chrono::duration_cast<std::chrono::milliseconds>(backoff).count());
      }
    }
    out.push_back(exit);
  }
  return out;
}

std::vector<uint32_t> Supervisor::restart_due(uint64_t now_ns) {
  std::vector<uint32_t> started;
  if (stopping_) return started;
  for (uint32_t rank = 0; rank < ranks_.size(); ++rank) {
    Rank& r = ranks_[rank];
    if (r.gave_up || r.pid != 0 || r.restart_at_ns == 0 || r.restart_at_ns > now_ns) continue;
    ++r.restarts;
    if (Status s = spawn(rank); !s) {
      spdlog::error("rank {}: {}", rank, s.error().message);
      r.restart_at_ns = now_ns + ns_of(kMaxBackoff);
      continue;
    }
    started.push_back(rank);
  }
  return started;
}

void Supervisor::note_ready(uint32_t rank, uint32_t pid) {
  Rank& r = ranks_[rank];
  if (r.pid == pid && pid != 0) r.ready = true;
}

uint64_t Supervisor::next_restart_ns() const {
  uint64_t next = UINT64_MAX;
  for (const Rank& r : ranks_)
    if (r.pid == 0 && r.restart_at_ns != 0) next = std::min(next, r.restart_at_ns);
  return next;
}

void Supervisor::stop_all(Deadline deadline) {
  stopping_ = true;
  auto alive = [&] {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.pid != 0; });
  };
  while (alive() && !deadline.passed())
    poll_exits(deadline);
  for (uint32_t rank = 0; rank < ranks_.size(); ++rank) {
    Rank& r = ranks_[rank];
    if (r.pid == 0) continue;
    spdlog::warn("rank {} worker (pid {}) did not exit in time; killing it", rank, r.pid);
    kill(static_cast<pid_t>(r.pid), SIGKILL);
  }
  for (int i = 0; i < 10 && alive(); ++i)
    poll_exits(Deadline::after(std::chrono::seconds(1)));
}

}  // namespace kvrelay::coordinator
