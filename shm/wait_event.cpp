#include "shm/wait_event.h"

#include <sched.h>
#include <unistd.h>

#include <cstdlib>

namespace kvrelay {

namespace {
std::atomic<IdleStrategy> g_idle{IdleStrategy::kPark};
}

void set_idle_strategy(IdleStrategy s) {
  g_idle.store(s, std::memory_order_relaxed);
}

IdleStrategy idle_strategy() {
  return g_idle.load(std::memory_order_relaxed);
}

const char* idle_strategy_name(IdleStrategy s) {
  switch (s) {
    case IdleStrategy::kPark: return "park";
    case IdleStrategy::kBackoff: return "backoff";
    case IdleStrategy::kSpin: return "spin";
  }
  return "?";
}

bool parse_idle_strategy(std::string_view text, IdleStrategy& out) {
  for (IdleStrategy s : {IdleStrategy::kPark, IdleStrategy::kBackoff, IdleStrategy::kSpin}) {
    if (text == idle_strategy_name(s)) {
      out = s;
      return true;
    }
  }
  return false;
}

void detail::yield_cpu() {
  sched_yield();
}

uint64_t default_spin_ns() {
  static const uint64_t spin = [] {
    if (const char* env = getenv("KVRELAY_SPIN_NS"); env != nullptr)
      return static_cast<uint64_t>(std::strtoull(env, nullptr, 10));
    return static_cast<uint64_t>(sysconf(_SC_NPROCESSORS_ONLN) > 1 ? 20'000 : 0);
  }();
  return spin;
}

}  // namespace kvrelay
