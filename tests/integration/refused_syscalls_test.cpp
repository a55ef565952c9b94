// kvrelay under a strict container profile or an older kernel: both
// instances run with pidfd_open, membarrier and the scheduler-slice calls
// refused (EPERM as a seccomp profile that predates them answers, ENOSYS as
// a kernel that lacks them does). They must start, move a request, notice a
// worker killed with SIGKILL, restart it, and stop cleanly: the coordinator
// polls its workers' exits, the rings fence without membarrier, and the
// slice stays the kernel's default.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include "integration/dump_json.h"
#include "integration/two_instances.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

constexpr const char* kRefused = "pidfd_open,membarrier,sched_setattr,sched_getattr";

class RefusedSyscalls : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string helper = Instance::bin("kvrelay-test-refuse-syscalls");
    std::string output;
    if (run_program({helper, GetParam(), kRefused, "/bin/true"}, &output) != 0)
      GTEST_SKIP() << "cannot install a seccomp filter here: " << output;
    prefix_ = {helper, GetParam(), kRefused};
  }
  std::vector<std::string> prefix_;
};

TEST_P(RefusedSyscalls, InstancesMoveRequestsAndRestartAKilledWorker) {
  InstanceArgs a;
  a.tp = 2;
  a.layers = 4;
  a.blocks = 64;
  Placement where;
  where.prefill_prefix = prefix_;
  where.decode_prefix = prefix_;
  TwoInstances env(std::string("refused-") + GetParam(), a, where);

  const sim::RequestBlocks before{1, {1, 2, 3}, {4, 5, 6}};
  env.send_whole_request("before", before, 1, 0, a.layers);
  const Completion first = env.wait_for("before");
  ASSERT_EQ(first.status, CompletionStatus::kFinished) << first.message;
  EXPECT_EQ(env.wrong_words(before), 0u);

  // Seen without a pidfd: the coordinator polls its workers' exits.
  const uint32_t victim = worker_pid(env.prefill().name(), 1);
  ASSERT_NE(victim, 0u);
  ASSERT_EQ(kill(static_cast<pid_t>(victim), SIGKILL), 0);
  const Deadline until = Deadline::after(20s);
  while (!(env.engine().rank_ready(1) && worker_pid(env.prefill().name(), 1) != victim) &&
         !until.passed())
    std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(env.engine().rank_ready(1)) << "rank 1 was not restarted";
  EXPECT_EQ(dump_json(env.prefill().name())["coordinator"]["counters"]["worker_restarts"], 1);
  EXPECT_NE(access(("/proc/" + std::to_string(victim)).c_str(), F_OK), 0)
      << "the killed worker was not reaped";

  const sim::RequestBlocks after{2, {7, 8}, {9, 10}};
  env.send_whole_request("after", after, 2, 0, a.layers);
  const Completion second = env.wait_for("after");
  EXPECT_EQ(second.status, CompletionStatus::kFinished) << second.message;
  EXPECT_EQ(env.wrong_words(after), 0u);
  EXPECT_EQ(env.wrong_words(before), 0u);
  env.stop_and_check_clean();
}

INSTANTIATE_TEST_SUITE_P(AsAProfileOrAnOldKernelAnswers, RefusedSyscalls,
                         ::testing::Values("EPERM", "ENOSYS"));

}  // namespace
}  // namespace kvrelay::testing
