#include "shm/fault_point.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

namespace kvrelay::fault {

namespace {

constexpr int kMaxPoints = 16;

struct Point {
  char name[64];
  Action action;
  uint32_t nth;
  std::atomic<uint32_t> hits;
};

Point g_points[kMaxPoints];
std::atomic<int> g_count{0};

Action parse_action(std::string_view s) {
  if (s == "kill") return Action::kKill;
  if (s == "stop") return Action::kStop;
  if (s == "exit") return Action::kExit;
  return Action::kNone;
}

// KVRELAY_FAULT=name=action[@nth][,name=action[@nth]...]
const bool g_from_env = [] {
  const char* env = getenv("KVRELAY_FAULT");
  if (env == nullptr) return false;
  std::string_view rest(env);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) continue;
    std::string_view action = item.substr(eq + 1);
    uint32_t nth = 1;
    if (const size_t at = action.find('@'); at != std::string_view::npos) {
      nth = static_cast<uint32_t>(
          std::strtoul(std::string(action.substr(at + 1)).c_str(), nullptr, 10));
      action = action.substr(0, at);
    }
    arm(item.substr(0, eq), parse_action(action), nth == 0 ? 1 : nth);
  }
  return true;
}();

}  // namespace

void arm(std::string_view name, Action action, uint32_t nth) {
  const int i = g_count.load(std::memory_order_relaxed);
  if (i >= kMaxPoints || action == Action::kNone) return;
  Point& p = g_points[i];
  const size_t n = std::min(name.size(), sizeof(p.name) - 1);
  std::memcpy(p.name, name.data(), n);
  p.name[n] = '\0';
  p.action = action;
  p.nth = nth;
  p.hits.store(0, std::memory_order_relaxed);
  g_count.store(i + 1, std::memory_order_release);
}

void disarm_all() {
  g_count.store(0, std::memory_order_release);
}

void hit(const char* name) noexcept {
  const int n = g_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    Point& p = g_points[i];
    if (std::strcmp(p.name, name) != 0) continue;
    if (p.hits.fetch_add(1, std::memory_order_relaxed) + 1 != p.nth) continue;
    switch (p.action) {
      case Action::kKill: raise(SIGKILL); break;
      case Action::kStop: raise(SIGSTOP); break;
      case Action::kExit: _exit(86); break;
      case Action::kNone: break;
    }
  }
}

}  // namespace kvrelay::fault
