// Barrier round latency and futex wake latency across processes, ours
// against a baseline, side by side:
//
//   barrier: kvrelay Barrier  vs  pthread_barrier_t (PTHREAD_PROCESS_SHARED)
//            in the same shared memory, 2 and 4 processes; the round time is
//            the interval between consecutive returns from wait() in one
//            participant.
//   wake:    futex wake of a parked process  vs  a blocking pipe read; the
//            latency is from just before the wake call to the sleeper running.
//
// Target: 2-process barrier p50 <= 10 us. The original's
// manager-proxied barrier measured p50 161 us on these machines.
#include <fmt/format.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <new>
#include <thread>

#include "bench_support.h"
#include "shm/barrier.h"
#include "shm/clock.h"
#include "shm/futex.h"
#include "shm/command_line.h"

using namespace kvrelay;
using namespace kvrelay::bench;

namespace {

struct Shared {
  BarrierState ours;
  pthread_barrier_t theirs;
  alignas(64) std::atomic<uint32_t> word{0};
  alignas(64) std::atomic<uint64_t> t0{0};
  alignas(64) double samples[200'000];
};

Shared* map_shared() {
  void* p =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::abort();
  return new (p) Shared{};
}

// Runs `rounds` rounds with `procs` processes; participant 0 records each
// round's duration in microseconds.
template <class Wait>
Percentiles barrier_rounds(Shared* s, int procs, int rounds, Wait wait) {
  std::vector<pid_t> kids;
  for (int p = 1; p < procs; ++p) {
    kids.push_back(fork_worker([&] {
      for (int i = 0; i < rounds + 1; ++i)
        if (!wait()) return 1;
      return 0;
    }));
  }
  if (!wait()) return {};  // line everybody up once before measuring
  uint64_t last = mono_now_ns();
  for (int i = 0; i < rounds; ++i) {
    if (!wait()) return {};
    const uint64_t now = mono_now_ns();
    s->samples[i] = static_cast<double>(now - last) / 1e3;
    last = now;
  }
  for (pid_t k : kids)
    join_worker(k, "barrier participant");
  return percentiles(std::vector<double>(s->samples, s->samples + rounds));
}

void bench_barrier(int procs, int rounds, std::vector<Row>& rows) {
  Shared* s = map_shared();
  Barrier(s->ours).arm(static_cast<uint16_t>(procs));
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&s->theirs, &attr, static_cast<unsigned>(procs));

  const Percentiles ours = barrier_rounds(s, procs, rounds, [&] {
    return Barrier(s->ours).wait(Deadline::after(std::chrono::seconds(30))) == BarrierResult::kOk;
  });
  const Percentiles theirs = barrier_rounds(s, procs, rounds, [&] {
    const int r = pthread_barrier_wait(&s->theirs);
    return r == 0 || r == PTHREAD_BARRIER_SERIAL_THREAD;
  });
  for (auto [label, a, b] :
       {std::tuple{"p50", ours.p50, theirs.p50}, std::tuple{"p99", ours.p99, theirs.p99}}) {
    Row row{fmt::format("barrier round, {} processes, {}", procs, label), "us", a, b, false};
    print_row(row);
    rows.push_back(row);
  }
  munmap(s, sizeof(Shared));
}

// The waker sleeps between wakes so the sleeper is truly parked each time.
void bench_wake(int wakes, std::vector<Row>& rows) {
  Shared* s = map_shared();
  // futex
  const pid_t sleeper = fork_worker([&] {
    for (int i = 0; i < wakes; ++i) {
      // Wake i sets the word to i + 1.
      for (uint32_t seen = s->word.load(std::memory_order_acquire); seen < uint32_t(i + 1);
           seen = s->word.load(std::memory_order_acquire)) {
        futex_wait(s->word, seen, Deadline::after(std::chrono::seconds(10)));
      }
      s->samples[i] = static_cast<double>(mono_now_ns() - s->t0.load()) / 1e3;
    }
    return 0;
  });
  for (int i = 0; i < wakes; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    s->t0.store(mono_now_ns());
    s->word.fetch_add(1, std::memory_order_release);
    futex_wake_all(s->word);
  }
  join_worker(sleeper, "futex sleeper");
  const Percentiles ours = percentiles(std::vector<double>(s->samples, s->samples + wakes));

  // pipe
  int fds[2];
  if (pipe(fds) != 0) std::abort();
  const pid_t reader = fork_worker([&] {
    for (int i = 0; i < wakes; ++i) {
      uint64_t t0 = 0;
      if (read(fds[0], &t0, sizeof(t0)) != sizeof(t0)) return 1;
      s->samples[i] = static_cast<double>(mono_now_ns() - t0) / 1e3;
    }
    return 0;
  });
  for (int i = 0; i < wakes; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    const uint64_t t0 = mono_now_ns();
    if (write(fds[1], &t0, sizeof(t0)) != sizeof(t0)) std::abort();
  }
  join_worker(reader, "pipe reader");
  close(fds[0]);
  close(fds[1]);
  const Percentiles theirs = percentiles(std::vector<double>(s->samples, s->samples + wakes));
  for (auto [label, a, b] :
       {std::tuple{"p50", ours.p50, theirs.p50}, std::tuple{"p99", ours.p99, theirs.p99}}) {
    Row row{fmt::format("wake a parked process, {}", label), "us", a, b, false};
    print_row(row);
    rows.push_back(row);
  }
  munmap(s, sizeof(Shared));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvrelay barrier and futex wake latency benchmarks"};
  int rounds = 50'000;
  int wakes = 2'000;
  app.add_option("--rounds", rounds, "barrier rounds per case")->check(CLI::Range(100, 200'000));
  app.add_option("--wakes", wakes, "wake-ups measured")->check(CLI::Range(10, 200'000));
  std::string python = "python3";
  std::string script;
  app.add_option("--python-baseline", script,
                 "tools/bench/manager_baseline.py: also measure the original's proxied barrier");
  app.add_option("--python", python, "the interpreter for the baseline")->capture_default_str();
  kvrelay::add_version_flag(app, "kvrelay-bench-barrier");
  KVRELAY_PARSE_COMMAND_LINE(app, argc, argv);

  std::vector<Row> rows;
  print_header("Barrier round latency (microseconds, lower is better)", "pthread pshared");
  bench_barrier(2, rounds, rows);
  bench_barrier(4, rounds / 5, rows);
  const double p50_2 = rows[0].ours;
  const double p50_4 = rows[2].ours;  // rows: 2 ranks p50, p99; 4 ranks p50, p99

  if (!script.empty()) {
    // The original's barrier: a threading.Barrier behind a multiprocessing
    // manager, every wait() a proxied call over TCP.
    print_header("Barrier round against the original's (microseconds, lower is better)",
                 "proxied Barrier");
    for (auto [ranks, ours_p50] : {std::pair{2, p50_2}, std::pair{4, p50_4}}) {
      const PythonBaseline base = run_python_baseline(
          python, script, fmt::format("barrier --ranks {} --rounds 2000", ranks));
      if (!base.ok) return 1;
      print_row(Row{fmt::format("{} processes, p50", ranks), "us", ours_p50, base.p50_us, false});
    }
  }
  print_target("2-process barrier p50 <= 10 us", p50_2 <= 10.0,
               fmt::format("p50 {:.2f} us; the original's proxied barrier measured 161 us", p50_2));

  print_header("Futex wake latency (microseconds, lower is better)", "pipe read");
  bench_wake(wakes, rows);
  return 0;
}
