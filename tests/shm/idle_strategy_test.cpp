// Idle strategies (--idle-strategy) and CPU lists (--cpu-list): every
// strategy wakes on the data and honours its deadline; spin never parks, so
// its notifiers never make a system call.
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <thread>

#include "shm/cpu_affinity.h"
#include "shm/wait_event.h"
#include "support/processes.h"

namespace kvrelay {
namespace {

using namespace std::chrono_literals;

TEST(CpuList, RangesAndSinglesParseInTheOrderWritten) {
  auto one = parse_cpu_list("3");
  ASSERT_TRUE(one) << one.error().message;
  EXPECT_EQ(*one, std::vector<int>{3});
  auto many = parse_cpu_list("2-5,8,0");
  ASSERT_TRUE(many) << many.error().message;
  EXPECT_EQ(*many, (std::vector<int>{2, 3, 4, 5, 8, 0}));
}

TEST(CpuList, MistakesAreRefusedNamingWhatIsWrong) {
  const std::pair<const char*, const char*> bad[] = {
      {"", "empty"},          {"a", "'a' is not a CPU"},  {"5-2", "runs backwards"},
      {"1,1", "listed twice"}, {"1-", "'1-' is not a CPU"}, {"99999", "beyond"},
      {"-1", "is not a CPU"},  {"1,,2", "'' is not a CPU"}};
  for (const auto& [text, why] : bad) {
    auto r = parse_cpu_list(text);
    ASSERT_FALSE(r) << text;
    EXPECT_EQ(r.code(), Errc::kInvalidArgument);
    EXPECT_NE(r.error().message.find(why), std::string::npos) << text << ": " << r.error().message;
  }
}

TEST(CpuList, AProcessIsPlacedOnItsEntryRoundRobin) {
  // In a child: pinning is for the whole process.
  const pid_t pid = testing::fork_child([] {
    const std::vector<int> cpus{0};
    if (!place_process(IdleStrategy::kSpin, cpus, 3)) return 1;
    if (idle_strategy() != IdleStrategy::kSpin) return 2;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return 3;
    return CPU_COUNT(&set) == 1 && CPU_ISSET(0, &set) ? 0 : 4;
  });
  auto exit = testing::wait_child(pid, 10s);
  ASSERT_TRUE(exit && exit->exited);
  EXPECT_EQ(exit->code, 0);
}

class IdleStrategies : public ::testing::TestWithParam<IdleStrategy> {
 protected:
  void SetUp() override { set_idle_strategy(GetParam()); }
  void TearDown() override { set_idle_strategy(IdleStrategy::kPark); }
};

TEST_P(IdleStrategies, AWaiterWakesOnTheDataAndTimesOutWithoutIt) {
  WaitEvent ev{};
  std::atomic<int> data{0};
  std::thread notifier([&] {
    std::this_thread::sleep_for(5ms);  // past the spin: park and backoff really wait
    data.store(1, std::memory_order_release);
    notify_waiters(ev);
  });
  EXPECT_TRUE(wait_until(
      ev, [&] { return data.load(std::memory_order_acquire) == 1; }, Deadline::after(10s)));
  notifier.join();
  const uint64_t t0 = mono_now_ns();
  EXPECT_FALSE(wait_until(
      ev, [&] { return data.load(std::memory_order_acquire) == 2; }, Deadline::after(20ms)));
  const bool returned_early = mono_now_ns() < t0 + 20'000'000;
  EXPECT_FALSE(returned_early) << "not before its deadline";
  EXPECT_EQ(ev.waiters.load(), 0u) << "no waiter left announced";
  if (GetParam() == IdleStrategy::kSpin) {
    EXPECT_EQ(ev.wake_calls.load(), 0u) << "a spinning waiter never parks: no wake syscall";
  }
}

INSTANTIATE_TEST_SUITE_P(All, IdleStrategies,
                         ::testing::Values(IdleStrategy::kPark, IdleStrategy::kBackoff,
                                           IdleStrategy::kSpin),
                         [](const auto& strategy) {
                           return std::string(idle_strategy_name(strategy.param));
                         });

TEST(IdleStrategyNames, RoundTrip) {
  for (IdleStrategy s : {IdleStrategy::kPark, IdleStrategy::kBackoff, IdleStrategy::kSpin}) {
    IdleStrategy parsed{};
    ASSERT_TRUE(parse_idle_strategy(idle_strategy_name(s), parsed));
    EXPECT_EQ(parsed, s);
  }
  IdleStrategy untouched = IdleStrategy::kBackoff;
  EXPECT_FALSE(parse_idle_strategy("busy", untouched));
  EXPECT_EQ(untouched, IdleStrategy::kBackoff);
}

}  // namespace
}  // namespace kvrelay
