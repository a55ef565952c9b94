#include "shm/liveness.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace kvrelay {

const char* slot_state_name(uint32_t state) {
  switch (static_cast<SlotState>(state)) {
    case SlotState::kEmpty: return "empty";
    case SlotState::kStarting: return "starting";
    case SlotState::kReady: return "ready";
    case SlotState::kExiting: return "exiting";
  }
  return "invalid";
}

void register_self(LivenessSlot& slot, SlotState state) {
  const ProcessIdentity me = self_identity();
  const uint32_t seq = slot.sequence.load(std::memory_order_relaxed);
  slot.sequence.store(seq | 1U, std::memory_order_relaxed);  // odd: being rewritten
  std::atomic_thread_fence(std::memory_order_release);
  slot.pid.store(me.pid, std::memory_order_relaxed);
  slot.start_time.store(me.start_time, std::memory_order_relaxed);
  slot.pid_ns.store(me.pid_ns, std::memory_order_relaxed);
  const uint64_t now = mono_now_ns();
  slot.registered_ns.store(now, std::memory_order_relaxed);
  slot.heartbeat_ns.store(now, std::memory_order_relaxed);
  slot.registrations.fetch_add(1, std::memory_order_relaxed);
  slot.state.store(static_cast<uint32_t>(state), std::memory_order_relaxed);
  slot.sequence.store((seq | 1U) + 1, std::memory_order_release);  // even: consistent
}

void release_slot(LivenessSlot& slot) {
  set_state(slot, SlotState::kEmpty);
}

SlotSnapshot read_slot(const LivenessSlot& slot) {
  SlotSnapshot s;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const uint32_t before = slot.sequence.load(std::memory_order_acquire);
    if ((before & 1U) != 0) continue;
    s.owner.pid = slot.pid.load(std::memory_order_relaxed);
    s.owner.start_time = slot.start_time.load(std::memory_order_relaxed);
    s.owner.pid_ns = slot.pid_ns.load(std::memory_order_relaxed);
    s.registrations = slot.registrations.load(std::memory_order_relaxed);
    s.registered_ns = slot.registered_ns.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.sequence.load(std::memory_order_relaxed) == before) break;
  }
  const uint32_t state = slot.state.load(std::memory_order_acquire);
  s.state = state <= static_cast<uint32_t>(SlotState::kExiting) ? static_cast<SlotState>(state)
                                                                : SlotState::kEmpty;
  s.heartbeat_ns = slot.heartbeat_ns.load(std::memory_order_acquire);
  return s;
}

const char* peer_health_name(PeerHealth h) {
  switch (h) {
    case PeerHealth::kAbsent: return "absent";
    case PeerHealth::kHealthy: return "healthy";
    case PeerHealth::kSilent: return "silent";
    case PeerHealth::kDead: return "dead";
  }
  return "unknown";
}

namespace {

PeerHealth by_heartbeat(const SlotSnapshot& slot, Nanos max_heartbeat_age) {
  const uint64_t now = mono_now_ns();
  const uint64_t age = now > slot.heartbeat_ns ? now - slot.heartbeat_ns : 0;
  return age > static_cast<uint64_t>(max_heartbeat_age.count()) ? PeerHealth::kSilent
                                                                : PeerHealth::kHealthy;
}

}  // namespace

PeerHealth judge_peer(const SlotSnapshot& slot, Nanos max_heartbeat_age, LockState lock) {
  if (slot.state == SlotState::kEmpty || slot.owner.pid == 0) return PeerHealth::kAbsent;
  if (lock == LockState::kFree) return PeerHealth::kDead;
  if (lock == LockState::kUnknown) {
    const Liveness l = check_liveness(slot.owner, {});
    if (l != Liveness::kAlive && l != Liveness::kUnverifiable) return PeerHealth::kDead;
  }
  return by_heartbeat(slot, max_heartbeat_age);
}

LockState CachedPeerJudge::lock_state() {
  const uint64_t now = mono_now_ns();
  const auto last = static_cast<LockState>(last_.load(std::memory_order_acquire));
  if (last == LockState::kHeld &&
      now - checked_ns_.load(std::memory_order_relaxed) < static_cast<uint64_t>(recheck_.count()))
    return last;
  const LockState fresh = lock_.probe();
  checked_ns_.store(now, std::memory_order_relaxed);
  last_.store(static_cast<int>(fresh), std::memory_order_release);
  return fresh;
}

PeerHealth CachedPeerJudge::judge(const SlotSnapshot& slot, Nanos max_heartbeat_age) {
  if (slot.state == SlotState::kEmpty || slot.owner.pid == 0) return PeerHealth::kAbsent;
  return judge_peer(slot, max_heartbeat_age, lock_state());
}

std::string PidfdWatcher::Exit::describe() const {
  if (signal != 0) {
    const char* abbrev = sigabbrev_np(signal);
    return fmt::format("killed by SIG{}", abbrev != nullptr ? abbrev : std::to_string(signal));
  }
  return fmt::format("exit code {}", exit_code);
}

PidfdWatcher::~PidfdWatcher() {
  for (const Entry& e : entries_)
    if (e.fd >= 0) close(e.fd);
}

Status PidfdWatcher::watch(uint32_t pid) {
  const long fd = syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0);
  if (fd < 0) {
    const int err = errno;
    // A child that is not there cannot be watched either way; any other
    // refusal (EPERM or ENOSYS from a filter or an old kernel, EMFILE) is
    // answered by polling it.
    if (err == ESRCH) return system_error(fmt::format("pidfd_open({})", pid), err);
    if (polling_reason_.empty())
      polling_reason_ = system_error(fmt::format("pidfd_open({})", pid), err).message;
  }
  entries_.push_back(Entry{pid, static_cast<int>(fd < 0 ? -1 : fd)});
  return {};
}

std::optional<PidfdWatcher::Exit> PidfdWatcher::reap(const Entry& e) const {
  // By pid, not by pidfd: the child's pid is its own until it is reaped
  // (P_PIDFD needs Linux 5.4, and a polled child has no pidfd).
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(e.pid), &info, WEXITED | WNOHANG) != 0) {
    // Not our child, or reaped by somebody else: a readable pidfd, or a
    // polled pid that is nobody's child any more, means it has gone. Its
    // status cannot be known.
    if (errno != ECHILD) return std::nullopt;
    return Exit{e.pid, -1, 0};
  }
  if (info.si_pid == 0) return std::nullopt;  // still running (or not yet reapable)
  Exit exit{e.pid, -1, 0};
  if (info.si_code == CLD_EXITED) {
    exit.exit_code = info.si_status;
  } else if (info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED) {
    exit.signal = info.si_status;
  }
  return exit;
}

std::vector<PidfdWatcher::Exit> PidfdWatcher::wait(Deadline deadline) {
  std::vector<Exit> exits;
  if (entries_.empty()) return exits;
  std::vector<pollfd> fds;
  fds.reserve(entries_.size());
  bool polled = false;
  for (const Entry& e : entries_) {
    fds.push_back(pollfd{e.fd, POLLIN, 0});  // poll() skips a negative fd
    polled = polled || e.fd < 0;
  }
  for (;;) {
    Nanos remaining = deadline.passed() ? Nanos(0) : deadline.remaining();
    if (polled) {  // sleep no longer than until the polled children are due
      const uint64_t now = mono_now_ns();
      remaining = std::min(
          remaining, Nanos(static_cast<int64_t>(next_look_ns_ > now ? next_look_ns_ - now : 0)));
    }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(remaining);
    // Round up so that a sub-millisecond remainder still sleeps.
    const int timeout = remaining.count() == 0 ? 0 : static_cast<int>(ms.count()) + 1;
    const int n = poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) return exits;
    // A waitid per polled child costs as much as the one poll() for all
    // pidfds: the polled ones are looked at every kPollEvery, however
    // often the caller asks.
    const uint64_t now = mono_now_ns();
    const bool look = polled && now >= next_look_ns_;
    if (look) next_look_ns_ = now + ns_of(kPollEvery);
    for (size_t i = 0; n >= 0 && i < fds.size(); ++i) {
      const bool due =
          entries_[i].fd >= 0 ? (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0 : look;
      if (!due) continue;
      if (std::optional<Exit> exit = reap(entries_[i])) exits.push_back(*exit);
    }
    if (!exits.empty() || deadline.passed() || (!polled && n >= 0)) break;
  }
  for (const Exit& x : exits) {
    auto it = std::find_if(entries_.begin(), entries_.end(),
                           [&](const Entry& e) { return e.pid == x.pid; });
    if (it != entries_.end()) {
      if (it->fd >= 0) close(it->fd);
      entries_.erase(it);
    }
  }
  return exits;
}

}  // namespace kvrelay
