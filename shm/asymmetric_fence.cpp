#include "shm/asymmetric_fence.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace kvrelay {

namespace fence_detail {

std::atomic<int> light_mode{0};

namespace {

long membarrier(int cmd) {
  return syscall(SYS_membarrier, cmd, 0U, 0);
}

bool kernel_supports_global_expedited() {
  static const bool supported = [] {
    const long mask = membarrier(MEMBARRIER_CMD_QUERY);
    return mask > 0 && (mask & MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0 &&
           (mask & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) != 0;
  }();
  return supported;
}

// A forked child must register itself again before relying on the light side.
void reset_after_fork() {
  light_mode.store(0, std::memory_order_relaxed);
}

}  // namespace

int decide_light_mode() {
  static const bool atfork_installed = [] {
    pthread_atfork(nullptr, nullptr, reset_after_fork);
    return true;
  }();
  (void)atfork_installed;
  const int mode = kernel_supports_global_expedited() &&
                           membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0
                       ? 1
                       : 2;
  // This first call cannot rely on the registration yet: fence for real.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  light_mode.store(mode, std::memory_order_relaxed);
  return mode;
}

}  // namespace fence_detail

bool heavy_fence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!fence_detail::kernel_supports_global_expedited()) return false;
  return fence_detail::membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0;
}

}  // namespace kvrelay
