// The supervisor's restart policy, with stand-in workers (shell scripts) as
// real child processes: a worker that fails the same way at every start
// before it is ready is given up; one that became ready and was then killed
// is restarted however often that happens (an OOM kill, a soak's SIGKILL),
// and a ready run clears the count of failed starts before it (a note from
// another pid does not).
#include "coordinator/supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

namespace kvrelay::coordinator {
namespace {

using namespace std::chrono_literals;

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/kvrelay-supervisor-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override {
    supervisor_.reset();  // stops whatever still runs
    for (const std::string& f : files_)
      unlink(f.c_str());
    rmdir(dir_.c_str());
  }
  // A stand-in worker: `body` run by /bin/sh, whatever arguments it gets.
  std::string script(const std::string& name, const std::string& body) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    chmod(path.c_str(), 0700);
    files_.push_back(path);
    return path;
  }
  void start(const std::string& worker) {
    supervisor_ = std::make_unique<Supervisor>(worker, "supervisor-test", 1, "", "error");
    ASSERT_TRUE(supervisor_->start_all());
  }
  // The next exit of rank 0, waiting at most 10 s for it.
  WorkerExit next_exit() {
    std::vector<WorkerExit> exits;
    const Deadline until = Deadline::after(10s);
    while (exits.empty() && !until.passed())
      exits = supervisor_->poll_exits(Deadline::after(100ms));
    EXPECT_EQ(exits.size(), 1U);
    return exits.empty() ? WorkerExit{} : exits.front();
  }
  // Waits through the backoff until rank 0 runs again; returns its pid.
  uint32_t restarted() {
    const Deadline until = Deadline::after(10s);
    while (supervisor_->pid_of(0) == 0 && !until.passed()) {
      (void)supervisor_->restart_due(mono_now_ns());
      usleep(10'000);
    }
    EXPECT_NE(supervisor_->pid_of(0), 0U) << "not restarted";
    return supervisor_->pid_of(0);
  }
  // Kills rank 0's worker; whether the supervisor then gave it up.
  bool kill_worker(bool was_ready) {
    const uint32_t pid = supervisor_->pid_of(0);
    if (was_ready) supervisor_->note_ready(0, pid);
    EXPECT_EQ(kill(static_cast<pid_t>(pid), SIGKILL), 0);
    const WorkerExit e = next_exit();
    EXPECT_EQ(e.pid, pid);
    EXPECT_EQ(e.reason, "killed by SIGKILL");
    EXPECT_EQ(e.gave_up, supervisor_->gave_up(0));
    return e.gave_up;
  }

  std::string dir_;
  std::vector<std::string> files_;
  std::unique_ptr<Supervisor> supervisor_;
};

TEST_F(SupervisorTest, AWorkerThatFailsTheSameWayAtEveryStartIsGivenUpAfterFive) {
  start(script("fails", "exit 1"));
  for (uint32_t i = 1; i < Supervisor::kGiveUpAfter; ++i) {
    const WorkerExit e = next_exit();
    EXPECT_EQ(e.reason, "exit code 1");
    ASSERT_FALSE(e.gave_up) << "after " << i << " failed starts";
    restarted();
  }
  EXPECT_TRUE(next_exit().gave_up);
  EXPECT_TRUE(supervisor_->gave_up(0));
  EXPECT_EQ(supervisor_->next_restart_ns(), UINT64_MAX) << "nothing more to restart";
  EXPECT_EQ(supervisor_->restarts(0), Supervisor::kGiveUpAfter - 1);
}

TEST_F(SupervisorTest, AWorkerKilledBeforeItIsReadyEveryTimeIsGivenUp) {
  start(script("sleeps", "exec sleep 60"));
  for (uint32_t i = 1; i < Supervisor::kGiveUpAfter; ++i) {
    ASSERT_FALSE(kill_worker(/*was_ready=*/false)) << "after " << i << " failed starts";
    restarted();
  }
  EXPECT_TRUE(kill_worker(/*was_ready=*/false));
}

TEST_F(SupervisorTest, AWorkerKilledWhileServingIsRestartedHoweverOftenItDies) {
  start(script("serves", "exec sleep 60"));
  for (uint32_t i = 1; i <= Supervisor::kGiveUpAfter; ++i) {
    ASSERT_FALSE(kill_worker(/*was_ready=*/true)) << "killed while serving, time " << i;
    EXPECT_NE(supervisor_->next_restart_ns(), UINT64_MAX) << "a restart is due";
    if (i < Supervisor::kGiveUpAfter) restarted();
  }
}

TEST_F(SupervisorTest, AReadyRunClearsTheFailedStartsBeforeIt) {
  start(script("mixed", "exec sleep 60"));
  // Four failed starts, then a run that got ready: the next failed start is
  // the first in a row again, not the fifth. (The backoff still grows: every
  // run was short.)
  for (int i = 0; i < 4; ++i) {
    ASSERT_FALSE(kill_worker(false));
    restarted();
  }
  ASSERT_FALSE(kill_worker(true));
  restarted();
  EXPECT_FALSE(kill_worker(false)) << "the ready run did not clear the count";
}

TEST_F(SupervisorTest, AReadyNoteForAnotherPidCountsForNothing) {
  start(script("stale", "exec sleep 60"));
  for (uint32_t i = 1; i < Supervisor::kGiveUpAfter; ++i) {
    ASSERT_FALSE(kill_worker(false));
    restarted();
  }
  // An earlier worker's slot may still say ready: that is not this start's.
  supervisor_->note_ready(0, supervisor_->pid_of(0) + 1);
  supervisor_->note_ready(0, 0);
  EXPECT_TRUE(kill_worker(false)) << "a stale ready note cleared the failed starts";
}

}  // namespace
}  // namespace kvrelay::coordinator
