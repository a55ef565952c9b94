#include "wake_floor.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdio>
#include <new>
#include <thread>

#include "bench_support.h"
#include "shm/clock.h"

namespace kvrelay::bench {

namespace {

constexpr uint32_t kMaxHops = 8;
constexpr uint64_t kStop = UINT64_MAX;

struct alignas(64) Stage {
  WaitEvent ev;
  alignas(64) std::atomic<uint64_t> round{0};
};

struct Chain {
  Stage stages[kMaxHops + 1];  // stage i wakes process i; the last wakes the parent
  alignas(64) std::atomic<uint64_t> woke_ns{0};
};

// Process `i` of the chain: waits on stage i, passes the round to stage i + 1.
int run_link(Chain& chain, uint32_t i, uint32_t hops) {
  uint64_t seen = 0;
  for (;;) {
    Stage& in = chain.stages[i];
    wait_until(
        in.ev, [&] { return in.round.load(std::memory_order_acquire) != seen; },
        Deadline::after(std::chrono::seconds(30)));
    const uint64_t round = in.round.load(std::memory_order_acquire);
    if (round == seen) return 1;  // the parent went away
    seen = round;
    if (round != kStop && i + 1 == hops) chain.woke_ns.store(mono_now_ns(), std::memory_order_relaxed);
    Stage& out = chain.stages[i + 1];
    out.round.store(round, std::memory_order_release);
    notify_waiters(out.ev);
    if (round == kStop) return 0;
  }
}

}  // namespace

std::vector<double> measure_wake_chain(uint32_t hops, int samples, IdleStrategy idle,
                                       uint32_t settle_us) {
  if (hops == 0 || hops > kMaxHops) return {};
  void* mem = mmap(nullptr, sizeof(Chain), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                   0);
  if (mem == MAP_FAILED) return {};
  auto* chain = new (mem) Chain{};
  std::vector<pid_t> links;
  for (uint32_t i = 0; i < hops; ++i) {
    links.push_back(fork_worker([&, i] {
      set_idle_strategy(idle);
      return run_link(*chain, i, hops);
    }));
  }
  const int warmup = 20;
  std::vector<double> out;
  Stage& back = chain->stages[hops];
  bool ok = true;
  for (int k = 1; k <= warmup + samples && ok; ++k) {
    std::this_thread::sleep_for(std::chrono::microseconds(settle_us));
    const uint64_t t0 = mono_now_ns();
    chain->stages[0].round.store(static_cast<uint64_t>(k), std::memory_order_release);
    notify_waiters(chain->stages[0].ev);
    ok = wait_until(
        back.ev,
        [&] { return back.round.load(std::memory_order_acquire) == static_cast<uint64_t>(k); },
        Deadline::after(std::chrono::seconds(5)));
    if (ok && k > warmup)
      out.push_back(static_cast<double>(chain->woke_ns.load(std::memory_order_relaxed) - t0) /
                    1e3);
  }
  chain->stages[0].round.store(kStop, std::memory_order_release);
  notify_waiters(chain->stages[0].ev);
  for (pid_t p : links)
    ok = join_worker(p, "wake chain link") && ok;
  munmap(mem, sizeof(Chain));
  if (!ok) {
    std::fprintf(stderr, "bench: the wake chain stalled\n");
    return {};
  }
  return out;
}

}  // namespace kvrelay::bench
