#include "shm/process_identity.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>

namespace kvrelay {

namespace {

// Field 22 (starttime) of /proc/<pid>/stat, or 0 when the process is gone.
// A zombie (state Z or X) has finished running and counts as gone. The
// command name (field 2) may contain spaces and parentheses, so parse from
// the last ')'.
uint64_t read_start_time(uint32_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return 0;
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return 0;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  // After ')' come fields 3 (state) ... 22 (starttime).
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return 0;
    if (i == 3 && (field == "Z" || field == "X")) return 0;
  }
  try {
    return std::stoull(field);
  } catch (...) {
    return 0;
  }
}

}  // namespace

namespace {
std::atomic<uint32_t> cached_pid{0};
void forget_pid_after_fork() {
  cached_pid.store(0, std::memory_order_relaxed);
}
}  // namespace

uint32_t self_pid() {
  uint32_t pid = cached_pid.load(std::memory_order_relaxed);
  if (pid != 0) return pid;
  static const bool atfork_installed = [] {
    pthread_atfork(nullptr, nullptr, forget_pid_after_fork);
    return true;
  }();
  (void)atfork_installed;
  pid = static_cast<uint32_t>(getpid());
  cached_pid.store(pid, std::memory_order_relaxed);
  return pid;
}

uint64_t self_pid_ns() {
  static const uint64_t ns = [] {
    struct stat st {};
    return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : uint64_t{0};
  }();
  return ns;
}

ProcessIdentity self_identity() {
  static const ProcessIdentity cached = identity_of(self_pid());
  // fork() children share the static; recompute when the pid changed.
  if (cached.pid == self_pid()) return cached;
  return identity_of(self_pid());
}

ProcessIdentity identity_of(uint32_t pid) {
  return ProcessIdentity{pid, read_start_time(pid), self_pid_ns()};
}

bool pid_exists(uint32_t pid) {
  if (pid == 0 || pid > static_cast<uint32_t>(INT32_MAX)) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return false;
  return read_start_time(pid) != 0;  // not a zombie
}

Liveness check_liveness(const ProcessIdentity& recorded, const std::string& boot) {
  if (!boot.empty() && boot != boot_id()) return Liveness::kOtherBoot;
  if (recorded.pid_ns != 0 && self_pid_ns() != 0 && recorded.pid_ns != self_pid_ns())
    return Liveness::kUnverifiable;
  const uint64_t now_start = recorded.pid == 0 ? 0 : read_start_time(recorded.pid);
  if (now_start == 0) return Liveness::kGone;
  if (recorded.start_time != 0 && now_start != recorded.start_time) return Liveness::kPidReused;
  return Liveness::kAlive;
}

const char* liveness_name(Liveness l) {
  switch (l) {
    case Liveness::kAlive: return "alive";
    case Liveness::kGone: return "gone";
    case Liveness::kPidReused: return "pid reused by another process";
    case Liveness::kOtherBoot: return "from a previous boot";
    case Liveness::kUnverifiable: return "in another pid namespace";
  }
  return "unknown";
}

const std::string& boot_id() {
  static const std::string id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string s;
    std::getline(in, s);
    return s;
  }();
  return id;
}

}  // namespace kvrelay
