#include "shm/scheduler_slice.h"

#include <fmt/format.h>
#include <linux/sched.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace kvrelay {

namespace {

// The kernel's struct sched_attr (include/uapi/linux/sched/types.h); glibc
// 2.36 has no wrapper for sched_setattr/sched_getattr.
struct SchedAttr {
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime;  // fair tasks (6.12+): the slice, in ns
  uint64_t sched_deadline;
  uint64_t sched_period;
  uint32_t sched_util_min;
  uint32_t sched_util_max;
};

Result<SchedAttr> current_attr(pid_t thread = 0) {
  SchedAttr a{};
  if (syscall(SYS_sched_getattr, thread, &a, sizeof(a), 0) != 0)
    return system_error("sched_getattr", errno);
  return a;
}

bool fair(uint32_t policy) {
  return policy == SCHED_OTHER || policy == SCHED_BATCH;
}

}  // namespace

Result<Nanos> scheduler_slice(pid_t thread) {
  Result<SchedAttr> a = current_attr(thread);
  if (!a) return a.error();
  return fair(a->sched_policy) ? Nanos(a->sched_runtime) : Nanos(0);
}

Result<Nanos> set_scheduler_slice(Nanos slice) {
  Result<SchedAttr> a = current_attr();
  if (!a) return a.error();
  if (!fair(a->sched_policy))
    return make_error(Errc::kUnsupported,
                      fmt::format("scheduling policy {} is not the fair class; its slice is left "
                                  "as it is",
                                  a->sched_policy));
  SchedAttr want = *a;
  want.size = sizeof(want);
  // Only reset-on-fork is carried over: KEEP_PARAMS would keep the old slice
  // too, and the utilisation clamps are not ours to touch.
  want.sched_flags = a->sched_flags & SCHED_FLAG_RESET_ON_FORK;
  want.sched_runtime = slice.count() > 0 ? static_cast<uint64_t>(slice.count()) : 0;
  if (syscall(SYS_sched_setattr, 0, &want, 0) != 0) return system_error("sched_setattr", errno);
  return scheduler_slice();
}

}  // namespace kvrelay
