// The coordinator's short scheduler slice (kvrelay-coordinator
// --wake-slice-us, shm/scheduler_slice.h) through real processes: the
// coordinator runs on it, and the workers it starts, which would inherit it,
// put the kernel's default back.
#include "shm/scheduler_slice.h"

#include <gtest/gtest.h>

#include "support/instance.h"
#include "support/processes.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

Nanos slice_of(pid_t pid) {
  Result<Nanos> s = scheduler_slice(pid);
  EXPECT_TRUE(s) << pid << ": " << s.error().message;
  return s ? *s : Nanos(-1);
}

class SchedulerSliceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<Nanos> own = scheduler_slice();
    if (!own || own->count() == 0) GTEST_SKIP() << "this kernel keeps no scheduler slice per task";
    default_slice_ = *own;
    if (default_slice_ == 100us) GTEST_SKIP() << "the test runner itself runs on a 100 us slice";
    const std::optional<ChildExit> asked =
        wait_child(fork_child([] { return set_scheduler_slice(100us) ? 0 : 1; }), 30s);
    if (!asked || !asked->exited || asked->code != 0)
      GTEST_SKIP() << "this process may not ask for a scheduler slice (a seccomp filter?)";
  }

  // The slices of an instance's coordinator and of its two workers.
  std::vector<Nanos> slices(const std::vector<std::string>& extra) {
    InstanceArgs a;
    a.instance = current_test_instance();
    a.tp = 2;
    a.extra = extra;
    std::unique_ptr<Instance> inst = Instance::start(a);
    EXPECT_TRUE(inst);
    if (!inst) return {};
    std::vector<Nanos> out{slice_of(inst->pid())};
    for (uint32_t rank = 0; rank < a.tp; ++rank)
      out.push_back(slice_of(static_cast<pid_t>(worker_pid(a.instance, rank))));
    EXPECT_EQ(inst->stop(), 0);
    return out;
  }

  Nanos default_slice_{0};
};

TEST_F(SchedulerSliceTest, TheCoordinatorRunsOnAShortSliceAndItsWorkersOnTheDefault) {
  const std::vector<Nanos> s = slices({});
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], 100us) << "the coordinator";
  EXPECT_EQ(s[1], default_slice_) << "rank 0's worker";
  EXPECT_EQ(s[2], default_slice_) << "rank 1's worker";
}

TEST_F(SchedulerSliceTest, ZeroLeavesTheCoordinatorOnTheKernelsDefault) {
  const std::vector<Nanos> s = slices({"--wake-slice-us", "0"});
  ASSERT_EQ(s.size(), 3u);
  for (Nanos n : s)
    EXPECT_EQ(n, default_slice_);
}

TEST_F(SchedulerSliceTest, AnotherSliceIsTakenAsAsked) {
  const std::vector<Nanos> s = slices({"--wake-slice-us", "250"});
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], 250us);
  EXPECT_EQ(s[1], default_slice_);
}

}  // namespace
}  // namespace kvrelay::testing
