#include "shm/wait_event.h"

#include <unistd.h>

namespace kvrelay {

uint64_t default_spin_ns() {
  static const uint64_t spin = sysconf(_SC_NPROCESSORS_ONLN) > 1 ? 20'000 : 0;
  return spin;
}

}  // namespace kvrelay
