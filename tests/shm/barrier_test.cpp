// Barrier: rounds across real processes, timeouts, and the death of a
// participant (SIGKILL), which must abort the others at once rather than at
// their timeout, and leave a barrier the survivors can keep using.
#include "shm/barrier.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "shm/fault_point.h"
#include "shm/liveness.h"
#include "support/processes.h"

namespace kvrelay {
namespace {

using testing::SharedRegion;
using namespace std::chrono_literals;

TEST(Barrier, SingleProcessRoundsCompleteImmediately) {
  SharedRegion mem(sizeof(BarrierState));
  auto* state = new (mem.data()) BarrierState{};
  Barrier b(*state);
  b.arm(1);
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(b.wait(Deadline::after(1s)), BarrierResult::kOk);
  EXPECT_EQ(b.snapshot().generation, 10u);
  EXPECT_EQ(b.snapshot().rounds_completed, 10u);
}

TEST(Barrier, TimeoutWithdrawsTheArrivalSoTheNextRoundStillNeedsEveryone) {
  SharedRegion mem(sizeof(BarrierState));
  auto* state = new (mem.data()) BarrierState{};
  Barrier b(*state);
  b.arm(2);
  EXPECT_EQ(b.wait(Deadline::after(20ms)), BarrierResult::kTimeout);
  const BarrierSnapshot s = b.snapshot();
  EXPECT_EQ(s.arrived, 0u) << "the timed-out arrival was withdrawn";
  EXPECT_EQ(s.generation, 0u);
  EXPECT_EQ(s.timeouts, 1u);
}

TEST(Barrier, UnarmedBarrierAbortsInsteadOfWaiting) {
  SharedRegion mem(sizeof(BarrierState));
  auto* state = new (mem.data()) BarrierState{};
  EXPECT_EQ(Barrier(*state).wait(Deadline::after(10s)), BarrierResult::kAborted);
}

// Four processes through 10,000 rounds. Each process counts its ok rounds;
// the generation must have advanced exactly 10,000 times.
TEST(BarrierProcesses, FourProcessesPassTenThousandRoundsTogether) {
  constexpr int kRounds = 10'000;
  constexpr int kProcs = 4;
  SharedRegion mem(sizeof(BarrierState));
  auto* state = new (mem.data()) BarrierState{};
  Barrier b(*state);
  b.arm(kProcs);

  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    kids.push_back(testing::fork_child([&] {
      Barrier mine(*state);
      for (int i = 0; i < kRounds; ++i) {
        if (mine.wait(Deadline::after(30s)) != BarrierResult::kOk) return 10;
      }
      return 0;
    }));
  }
  for (pid_t k : kids) {
    auto exit = testing::wait_child(k, 120s);
    ASSERT_TRUE(exit && exit->exited);
    EXPECT_EQ(exit->code, 0);
  }
  const BarrierSnapshot s = b.snapshot();
  EXPECT_EQ(s.generation, uint32_t(kRounds));
  EXPECT_EQ(s.rounds_completed, uint64_t(kRounds));
  EXPECT_EQ(s.rounds_poisoned, 0u);
}

// Four participants; one is SIGKILLed mid-run. The supervisor (this test
// process) notices through a pidfd and poisons the barrier. The three
// survivors, waiting with a 60 s deadline, must return kAborted (not
// kTimeout), then go on through 1,000 more rounds on the re-armed barrier.
TEST(BarrierProcesses, KilledParticipantAbortsTheOthersAndTheRearmedBarrierServesTheSurvivors) {
  constexpr int kProcs = 4;
  SharedRegion mem(sizeof(BarrierState) + 64);
  auto* state = new (mem.data()) BarrierState{};
  auto* aborted_seen =
      reinterpret_cast<std::atomic<uint32_t>*>(mem.as<std::byte>() + sizeof(BarrierState));
  Barrier b(*state);
  b.arm(kProcs);

  // The victim takes part in 100 rounds, then waits in the barrier forever
  // (it never returns) until it is killed.
  testing::ReadyPipe victim_done;
  const pid_t victim = testing::fork_child([&] {
    Barrier mine(*state);
    for (int i = 0; i < 100; ++i)
      if (mine.wait(Deadline::after(60s)) != BarrierResult::kOk) return 1;
    victim_done.signal();
    pause();
    return 0;
  });
  std::vector<pid_t> survivors;
  for (int p = 0; p < kProcs - 1; ++p) {
    survivors.push_back(testing::fork_child([&] {
      Barrier mine(*state);
      for (int i = 0; i < 100; ++i)
        if (mine.wait(Deadline::after(60s)) != BarrierResult::kOk) return 10;
      // Round 101 cannot complete: the victim never arrives.
      const BarrierResult r = mine.wait(Deadline::after(60s));
      if (r != BarrierResult::kAborted) return 11;
      aborted_seen->fetch_add(1);
      for (int i = 0; i < 1000; ++i)
        if (mine.wait(Deadline::after(60s)) != BarrierResult::kOk) return 12;
      return 0;
    }));
  }

  PidfdWatcher watcher;
  ASSERT_TRUE(watcher.watch(uint32_t(victim)).ok());
  // Wait until the victim has done its 100 rounds and the three survivors
  // are parked in round 101.
  ASSERT_TRUE(victim_done.wait(30s));
  const Deadline settle = Deadline::after(30s);
  while (b.snapshot().arrived < kProcs - 1 && !settle.passed())
    usleep(1000);
  ASSERT_EQ(b.snapshot().arrived, kProcs - 1);

  kill(victim, SIGKILL);
  auto exits = watcher.wait(Deadline::after(10s));
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].signal, SIGKILL);
  EXPECT_EQ(exits[0].describe(), "killed by SIGKILL");
  b.poison(kProcs - 1);

  for (pid_t s : survivors) {
    auto exit = testing::wait_child(s, 60s);
    ASSERT_TRUE(exit && exit->exited);
    EXPECT_EQ(exit->code, 0) << "10: early failure, 11: not aborted, 12: re-armed rounds failed";
  }
  EXPECT_EQ(aborted_seen->load(), uint32_t(kProcs - 1));
  const BarrierSnapshot s = b.snapshot();
  EXPECT_EQ(s.rounds_poisoned, 1u);
  EXPECT_EQ(s.rounds_completed, 100u + 1000u);
  EXPECT_EQ(s.parties, kProcs - 1);
}

// A waiter paused right after arriving (stopped at the fault point) sleeps
// through a poison of its round and a re-armed round that completes without
// it. It must learn that its own round was aborted: the old barrier inferred
// "ok" from the parity of the generation's distance.
TEST(BarrierProcesses, AWaiterPausedAcrossAPoisonAndACompletedRoundSeesItsRoundAborted) {
  SharedRegion mem(sizeof(BarrierState));
  auto* state = new (mem.data()) BarrierState{};
  Barrier b(*state);
  b.arm(2);
  const pid_t paused = testing::fork_child([&] {
    fault::arm("barrier.arrived", fault::Action::kStop);
    return static_cast<int>(Barrier(*state).wait(Deadline::after(60s)));
  });
  int status = 0;
  ASSERT_EQ(waitpid(paused, &status, WUNTRACED), paused);
  ASSERT_TRUE(WIFSTOPPED(status));
  b.poison(2);
  std::vector<pid_t> pair;
  for (int i = 0; i < 2; ++i)
    pair.push_back(testing::fork_child(
        [&] { return Barrier(*state).wait(Deadline::after(30s)) == BarrierResult::kOk ? 0 : 1; }));
  for (pid_t p : pair) {
    auto exit = testing::wait_child(p, 30s);
    ASSERT_TRUE(exit && exit->exited);
    EXPECT_EQ(exit->code, 0);
  }
  kill(paused, SIGCONT);
  auto exit = testing::wait_child(paused, 30s);
  ASSERT_TRUE(exit && exit->exited);
  EXPECT_EQ(exit->code, static_cast<int>(BarrierResult::kAborted));
}

// The reverse: its round completed, and a poison followed while it slept.
TEST(BarrierProcesses, AWaiterPausedAcrossItsCompletedRoundAndAPoisonSeesItsRoundOk) {
  SharedRegion mem(sizeof(BarrierState));
  auto* state = new (mem.data()) BarrierState{};
  Barrier b(*state);
  b.arm(2);
  const pid_t paused = testing::fork_child([&] {
    fault::arm("barrier.arrived", fault::Action::kStop);
    return static_cast<int>(Barrier(*state).wait(Deadline::after(60s)));
  });
  int status = 0;
  ASSERT_EQ(waitpid(paused, &status, WUNTRACED), paused);
  ASSERT_TRUE(WIFSTOPPED(status));
  EXPECT_EQ(b.wait(Deadline::after(10s)), BarrierResult::kOk);  // completes its round
  b.poison(2);
  kill(paused, SIGCONT);
  auto exit = testing::wait_child(paused, 30s);
  ASSERT_TRUE(exit && exit->exited);
  EXPECT_EQ(exit->code, static_cast<int>(BarrierResult::kOk));
}

}  // namespace
}  // namespace kvrelay
