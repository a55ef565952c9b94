#include "shm/wait_event.h"

#include <unistd.h>

#include <cstdlib>

namespace kvrelay {

uint64_t default_spin_ns() {
  static const uint64_t spin = [] {
    if (const char* env = getenv("KVRELAY_SPIN_NS"); env != nullptr)
      return static_cast<uint64_t>(std::strtoull(env, nullptr, 10));
    return static_cast<uint64_t>(sysconf(_SC_NPROCESSORS_ONLN) > 1 ? 20'000 : 0);
  }();
  return spin;
}

}  // namespace kvrelay
