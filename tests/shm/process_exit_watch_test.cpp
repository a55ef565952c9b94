// Watching processes for their exit where pidfd_open is refused, as under a
// container's seccomp profile that predates it (EPERM) or on a kernel
// before 5.3 (ENOSYS): the pidfd watcher of a coordinator's workers and the
// watch of the engine that registered a pool fall back to polling. Each
// refusing case runs in a child, since a seccomp filter cannot be lifted.
#include "shm/process_exit_watch.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <fstream>

#include "shm/liveness.h"
#include "support/processes.h"
#include "support/syscall_refusal.h"

namespace kvrelay {
namespace {

using namespace std::chrono_literals;
using testing::fork_child;

// The child's exit code when it could not install the filter at all.
constexpr int kNoFilter = 77;

// Dies with its parent, so that a case that fails early leaves nothing
// behind (a sleeper holding the output pipe would keep ctest waiting).
pid_t sleeping_child() {
  return fork_child([] {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    pause();
    return 0;
  });
}

// No process holds a pid this high: pids stay below pid_max.
uint32_t unused_pid() {
  uint32_t max = 0;
  std::ifstream("/proc/sys/kernel/pid_max") >> max;
  return max;
}

// Runs `body` in a child whose pidfd_open fails with `error`.
int with_pidfd_refused(int error, const std::function<int()>& body) {
  return testing::run_in_child([&] {
    Result<std::vector<long>> numbers = testing::syscall_numbers({"pidfd_open"});
    if (!numbers || !testing::refuse_syscalls(*numbers, error)) return kNoFilter;
    return body();
  });
}

bool exited_within(const ProcessExitWatch& w, std::chrono::milliseconds within) {
  const Deadline until = Deadline::after(within);
  while (!w.exited() && !until.passed())
    std::this_thread::sleep_for(1ms);
  return w.exited();
}

// Watches a sleeping child, kills it (without reaping it: a zombie has
// exited too) and checks each step. 0 when all held.
int watch_one_exit(bool polled) {
  const pid_t child = sleeping_child();
  Result<ProcessExitWatch> w = ProcessExitWatch::start(static_cast<uint32_t>(child));
  if (!w) return 1;
  if (w->polling_reason().empty() == polled) return 2;
  if (polled && w->polling_reason().find("pidfd_open") == std::string::npos) return 3;
  if (w->pid() != static_cast<uint32_t>(child) || w->exited()) return 4;
  kill(child, SIGKILL);
  if (!exited_within(*w, 10s)) return 5;
  testing::kill_child(child);  // reaps it
  if (!w->exited()) return 6;
  if (ProcessExitWatch::start(unused_pid()).code() != Errc::kNotFound) return 7;
  return 0;
}

TEST(ProcessExitWatch, SeesAProcessExitThroughItsPidfd) {
  EXPECT_EQ(watch_one_exit(false), 0);
  EXPECT_FALSE(ProcessExitWatch().exited()) << "watching nothing, nothing exits";
}

TEST(ProcessExitWatch, FallsBackToProcWherePidfdOpenIsRefused) {
  for (int error : {EPERM, ENOSYS}) {
    const int code = with_pidfd_refused(error, [] { return watch_one_exit(true); });
    if (code == kNoFilter) GTEST_SKIP() << "cannot install a seccomp filter here";
    EXPECT_EQ(code, 0) << "errno " << error;
  }
}

// The coordinator's watcher of its workers, polled: exit codes and signals
// as through pidfds, and nothing at the deadline while nobody exits.
int watch_children_polled() {
  PidfdWatcher w;
  const pid_t sleeper = sleeping_child();
  if (!w.watch(static_cast<uint32_t>(sleeper))) return 1;
  if (w.polling_reason().find("pidfd_open") == std::string::npos) return 2;
  if (!w.wait(Deadline::after(20ms)).empty()) return 3;
  if (!w.wait(Deadline::now()).empty()) return 4;
  const pid_t exits_3 = fork_child([] { return 3; });
  if (!w.watch(static_cast<uint32_t>(exits_3))) return 5;
  kill(sleeper, SIGKILL);
  std::vector<PidfdWatcher::Exit> all;
  const Deadline give_up = Deadline::after(10s);
  while (all.size() < 2 && !give_up.passed())
    for (const PidfdWatcher::Exit& e : w.wait(Deadline::after(1s)))
      all.push_back(e);
  if (all.size() != 2 || w.watched() != 0) return 6;
  for (const PidfdWatcher::Exit& e : all) {
    if (e.pid == static_cast<uint32_t>(exits_3) && e.describe() != "exit code 3") return 7;
    if (e.pid == static_cast<uint32_t>(sleeper) && e.describe() != "killed by SIGKILL") return 8;
  }
  // Reaped by the watcher: nothing is left to reap.
  if (waitpid(-1, nullptr, WNOHANG) != -1 || errno != ECHILD) return 9;
  return 0;
}

TEST(PidfdWatcher, PollsItsChildrenWherePidfdOpenIsRefused) {
  for (int error : {EPERM, ENOSYS}) {
    const int code = with_pidfd_refused(error, watch_children_polled);
    if (code == kNoFilter) GTEST_SKIP() << "cannot install a seccomp filter here";
    EXPECT_EQ(code, 0) << "errno " << error;
  }
}

TEST(PidfdWatcher, WatchesThroughPidfdsWhereItMay) {
  PidfdWatcher w;
  const pid_t sleeper = sleeping_child();
  ASSERT_TRUE(w.watch(static_cast<uint32_t>(sleeper)));
  EXPECT_EQ(w.polling_reason(), "");
  testing::kill_child(sleeper);
}

}  // namespace
}  // namespace kvrelay
