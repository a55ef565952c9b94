// The scheduler slice hint (shm/scheduler_slice.h), each case in a child
// process so that the test runner keeps its own scheduling.
#include "shm/scheduler_slice.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>

#include "support/processes.h"

namespace kvrelay {
namespace {

using namespace std::chrono_literals;

// Runs `body` in a child; its return value is the child's exit code.
int in_child(const std::function<int()>& body) {
  return testing::run_in_child(body);
}

// Whether this kernel keeps a slice per task (Linux 6.12+) and lets this
// process ask for one (a container's seccomp filter may refuse the call).
bool kernel_keeps_slices() {
  Result<Nanos> s = scheduler_slice();
  return s && s->count() != 0 && in_child([] { return set_scheduler_slice(100us) ? 0 : 1; }) == 0;
}

TEST(SchedulerSlice, AShortSliceIsTakenAndZeroPutsTheDefaultBack) {
  if (!kernel_keeps_slices()) GTEST_SKIP() << "this kernel keeps no scheduler slice per task";
  EXPECT_EQ(in_child([] {
              const Nanos before = scheduler_slice().value();
              Result<Nanos> short_one = set_scheduler_slice(100us);
              if (!short_one || *short_one != 100us) return 1;
              if (scheduler_slice().value() != 100us) return 2;
              Result<Nanos> back = set_scheduler_slice(Nanos(0));
              if (!back || *back != before) return 3;
              return 0;
            }),
            0);
}

TEST(SchedulerSlice, TheNiceValueStays) {
  if (!kernel_keeps_slices()) GTEST_SKIP() << "this kernel keeps no scheduler slice per task";
  EXPECT_EQ(in_child([] {
              if (setpriority(PRIO_PROCESS, 0, 7) != 0) return 1;
              if (!set_scheduler_slice(100us)) return 2;
              errno = 0;
              return getpriority(PRIO_PROCESS, 0) == 7 && errno == 0 ? 0 : 3;
            }),
            0);
}

TEST(SchedulerSlice, ProcessesStartedAfterwardsInheritIt) {
  // Why a worker started by the coordinator puts the default back itself.
  if (!kernel_keeps_slices()) GTEST_SKIP() << "this kernel keeps no scheduler slice per task";
  EXPECT_EQ(in_child([] {
              if (!set_scheduler_slice(100us)) return 1;
              return in_child([] { return scheduler_slice().value() == 100us ? 0 : 1; }) == 0 ? 0
                                                                                              : 2;
            }),
            0);
}

TEST(SchedulerSlice, APolicyOutsideTheFairClassIsLeftAlone) {
  EXPECT_EQ(in_child([] {
              sched_param p{};
              if (sched_setscheduler(0, SCHED_IDLE, &p) != 0) return 1;
              Result<Nanos> s = set_scheduler_slice(100us);
              if (s || s.code() != Errc::kUnsupported) return 2;
              if (s.error().message.find("not the fair class") == std::string::npos) return 3;
              return sched_getscheduler(0) == SCHED_IDLE ? 0 : 4;
            }),
            0);
}

}  // namespace
}  // namespace kvrelay
