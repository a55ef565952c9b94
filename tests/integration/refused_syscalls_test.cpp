// kvrelay under a strict container profile or an older kernel: both
// instances run with pidfd_open, membarrier and the scheduler-slice calls
// refused (EPERM as a seccomp profile that predates them answers, ENOSYS as
// a kernel that lacks them does). They must start, move a request, notice a
// worker killed with SIGKILL, restart it, and stop cleanly: the coordinator
// polls its workers' exits, the rings fence without membarrier, and the
// slice stays the kernel's default.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "integration/dump_json.h"
#include "integration/memfd_pool_spec.h"
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

// An engine in a process of its own: attaches once the instance is up,
// registers a memfd pool as rank 0's device pool, says so on `ready_fd`,
// and waits to be killed. Exit codes name the step that failed.
int engine_that_registers(const std::string& instance, int ready_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // not left behind by a failed test
  std::optional<Client> client;
  const Deadline until = Deadline::after(30s);
  while (!client && !until.passed()) {
    Result<Client> c = Client::attach(instance, until);
    if (c)
      client.emplace(std::move(c).value());
    else
      std::this_thread::sleep_for(20ms);
  }
  if (!client) return 1;
  const PoolGeometry g = client->info().device_pool;
  const MemfdPool pool(g, g.tensors_per_layer());
  if (!client->register_pool(memfd_pool_spec(pool, 0), Deadline::after(5s))) return 2;
  Result<Completion> c = client->wait(Deadline::after(20s));
  if (!c || c->kind != CompletionKind::kRegisterPool || c->status != CompletionStatus::kFinished)
    return 3;
  if (write(ready_fd, "r", 1) != 1) return 4;
  pause();
  return 0;
}

// Where rank 0's device pool is, as kvrelay-dump tells it ("" for none).
std::string device_pool_location(const std::string& instance) {
  const nlohmann::json dump = dump_json(instance);  // kept: the loop walks into it
  for (const auto& pool : dump["workers"][0]["pools"])
    if (pool["tier"] == "device") return pool["location"].get<std::string>();
  return "";
}

TEST_P(RefusedSyscalls, AWorkerLetsGoOfTheMemoryOfAnEngineThatExited) {
  // The worker watches the engine through /proc where it may not have a
  // pidfd of it.
  InstanceArgs a;
  a.instance = unique_instance(std::string("refused-owner-") + GetParam());
  a.extra = {"--pool", "none"};
  a.prefix = prefix_;
  int ready[2];
  ASSERT_EQ(pipe2(ready, O_CLOEXEC), 0);
  // Forked before the instance's client starts any thread here.
  const pid_t engine = fork_child([&] {
    close(ready[0]);
    return engine_that_registers(a.instance, ready[1]);
  });
  close(ready[1]);
  std::unique_ptr<Instance> inst = Instance::start(a);
  pollfd p{ready[0], POLLIN, 0};
  char registered = 0;
  const bool said = poll(&p, 1, 60'000) == 1 && read(ready[0], &registered, 1) == 1;
  close(ready[0]);
  if (!said) {
    const std::optional<ChildExit> e = wait_child(engine, 5s);
    FAIL() << "the engine did not register its pool (exit code " << (e ? e->code : -1) << ")";
  }
  EXPECT_EQ(device_pool_location(a.instance), "host-fd");

  kill(engine, SIGKILL);
  ASSERT_TRUE(wait_child(engine, 10s));
  const Deadline until = Deadline::after(10s);
  while (device_pool_location(a.instance) == "host-fd" && !until.passed())
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(device_pool_location(a.instance), "")
      << "rank 0 still serves the memory of an engine that exited";
  EXPECT_EQ(inst->stop(), 0);
  EXPECT_TRUE(inst->leftover_segments().empty());
}

INSTANTIATE_TEST_SUITE_P(AsAProfileOrAnOldKernelAnswers, RefusedSyscalls,
                         ::testing::Values("EPERM", "ENOSYS"));

}  // namespace
}  // namespace kvrelay::testing
