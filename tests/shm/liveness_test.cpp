// Liveness slots and the pidfd watcher.
#include "shm/liveness.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include "support/processes.h"

namespace kvrelay {
namespace {

using testing::SharedRegion;
using namespace std::chrono_literals;

TEST(Liveness, RegisteredSlotShowsOurIdentityAndAFreshHeartbeat) {
  SharedRegion mem(sizeof(LivenessSlot));
  auto* slot = new (mem.data()) LivenessSlot{};
  EXPECT_EQ(judge_peer(read_slot(*slot), 1s), PeerHealth::kAbsent);
  register_self(*slot, SlotState::kReady);
  const SlotSnapshot s = read_slot(*slot);
  EXPECT_EQ(s.owner.pid, uint32_t(getpid()));
  EXPECT_EQ(s.owner.start_time, self_identity().start_time);
  EXPECT_NE(s.owner.start_time, 0u);
  EXPECT_EQ(s.state, SlotState::kReady);
  EXPECT_EQ(s.registrations, 1u);
  EXPECT_EQ(judge_peer(s, 1s), PeerHealth::kHealthy);
}

TEST(Liveness, OldHeartbeatOfALiveProcessIsSilentNotDead) {
  SharedRegion mem(sizeof(LivenessSlot));
  auto* slot = new (mem.data()) LivenessSlot{};
  register_self(*slot, SlotState::kReady);
  slot->heartbeat_ns.store(mono_now_ns() - 5'000'000'000ULL);
  EXPECT_EQ(judge_peer(read_slot(*slot), 1s), PeerHealth::kSilent);
}

TEST(Liveness, SlotOfAKilledProcessIsJudgedDead) {
  SharedRegion mem(sizeof(LivenessSlot));
  auto* slot = new (mem.data()) LivenessSlot{};
  testing::ReadyPipe registered;
  const pid_t child = testing::fork_child([&] {
    register_self(*slot, SlotState::kReady);
    registered.signal();
    pause();
    return 0;
  });
  ASSERT_TRUE(registered.wait(10s));
  EXPECT_EQ(judge_peer(read_slot(*slot), 1s), PeerHealth::kHealthy);
  testing::kill_child(child);
  EXPECT_EQ(judge_peer(read_slot(*slot), 1s), PeerHealth::kDead);
}

TEST(Liveness, ReleasedSlotIsAbsent) {
  SharedRegion mem(sizeof(LivenessSlot));
  auto* slot = new (mem.data()) LivenessSlot{};
  register_self(*slot);
  release_slot(*slot);
  EXPECT_EQ(judge_peer(read_slot(*slot), 1s), PeerHealth::kAbsent);
}

TEST(PidfdWatcher, ReportsExitCodesAndSignalsOfChildren) {
  PidfdWatcher w;
  const pid_t exits_3 = testing::fork_child([] { return 3; });
  const pid_t sleeper = testing::fork_child([] {
    pause();
    return 0;
  });
  ASSERT_TRUE(w.watch(uint32_t(exits_3)).ok());
  ASSERT_TRUE(w.watch(uint32_t(sleeper)).ok());
  kill(sleeper, SIGKILL);
  std::vector<PidfdWatcher::Exit> all;
  const Deadline give_up = Deadline::after(10s);
  while (all.size() < 2 && !give_up.passed()) {
    for (auto& e : w.wait(Deadline::after(1s)))
      all.push_back(e);
  }
  ASSERT_EQ(all.size(), 2u);
  for (const auto& e : all) {
    if (e.pid == uint32_t(exits_3)) {
      EXPECT_EQ(e.exit_code, 3);
      EXPECT_EQ(e.describe(), "exit code 3");
    } else {
      EXPECT_EQ(e.pid, uint32_t(sleeper));
      EXPECT_EQ(e.describe(), "killed by SIGKILL");
    }
  }
  EXPECT_EQ(w.watched(), 0u);
}

TEST(PidfdWatcher, WaitReturnsEmptyAtTheDeadlineWhenNobodyExits) {
  PidfdWatcher w;
  const pid_t sleeper = testing::fork_child([] {
    pause();
    return 0;
  });
  ASSERT_TRUE(w.watch(uint32_t(sleeper)).ok());
  EXPECT_TRUE(w.wait(Deadline::after(20ms)).empty());
  testing::kill_child(sleeper);
}

TEST(ProcessIdentity, PidReuseIsToldApartByStartTime) {
  const ProcessIdentity me = self_identity();
  EXPECT_EQ(check_liveness(me, boot_id()), Liveness::kAlive);
  EXPECT_EQ(check_liveness(ProcessIdentity{me.pid, me.start_time + 1}, boot_id()),
            Liveness::kPidReused);
  EXPECT_EQ(check_liveness(me, "another-boot"), Liveness::kOtherBoot);
}

}  // namespace
}  // namespace kvrelay
