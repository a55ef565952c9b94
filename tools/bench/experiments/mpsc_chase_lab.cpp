// Experiment behind docs/benchmarks.md's "MPSC, one producer" breakdown:
// what one producer and one consumer chasing each other through an MpscRing
// cost, against either side alone. Prints the producer alone filling the
// ring and the consumer alone draining it (ns a record, one process), then a
// producer process and a consumer process pinned to CPUs 0 and 1 (two
// million 56-byte payloads, every sequence number checked), with the
// consumer pausing `relax` times after each read() that found nothing: 1 is
// a consumer that chases each record, larger ones let records pile up.
// Not built by CMake (one-off); from the project root, after a release build:
//   g++ -O2 -std=c++20 -I. -Iinclude -Ibuild/release/generated \
//     tools/bench/experiments/mpsc_chase_lab.cpp build/release/shm/libkvrelay_shm.a \
//     -lfmt -lspdlog -o mpsc_chase_lab && ./mpsc_chase_lab 1 16 64 256 1024
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "shm/clock.h"
#include "shm/futex.h"
#include "shm/mpsc_ring.h"

using namespace kvrelay;

namespace {

constexpr uint64_t kCapacity = 1 << 20;
constexpr uint64_t kRecords = 2'000'000;

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)sched_setaffinity(0, sizeof(set), &set);
}

// Either side alone: fill the ring, then drain it, five times.
void alone() {
  std::vector<std::byte> memory(MpscRing::bytes_for(kCapacity) + 64);
  void* region =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(memory.data()) + 63) & ~uintptr_t{63});
  (void)MpscRing::initialize(region, MpscRing::bytes_for(kCapacity), kCapacity,
                             MpscRing::default_max_payload(kCapacity));
  auto ring = MpscRing::attach(region, MpscRing::bytes_for(kCapacity)).value();
  auto producer = ring.lease_producer().value();
  std::byte payload[56] = {};
  for (int round = 0; round < 5; ++round) {
    uint64_t n = 0;
    const uint64_t t0 = mono_now_ns();
    while (producer.try_write(1, payload).ok())
      ++n;
    const uint64_t t1 = mono_now_ns();
    uint64_t read = 0;
    while (read < n)
      read += ring.read([](const MpscRecord&) {}, SIZE_MAX);
    const uint64_t t2 = mono_now_ns();
    std::printf("alone: %lu records, producer %.1f ns a record, consumer %.1f ns a record\n",
                static_cast<unsigned long>(n), static_cast<double>(t1 - t0) / n,
                static_cast<double>(t2 - t1) / n);
  }
}

void chase(uint32_t relax) {
  const size_t bytes = MpscRing::bytes_for(kCapacity);
  void* mapping =
      mmap(nullptr, bytes + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) std::exit(1);
  auto* go = new (mapping) std::atomic<int>(0);
  void* region = static_cast<char*>(mapping) + 4096;
  (void)MpscRing::initialize(region, bytes, kCapacity, MpscRing::default_max_payload(kCapacity));
  const pid_t child = fork();
  if (child == 0) {
    pin(0);
    auto ring = MpscRing::attach(region, bytes).value();
    auto producer = ring.lease_producer().value();
    std::byte payload[56] = {};
    while (go->load() == 0) {
    }
    for (uint64_t i = 0; i < kRecords; ++i) {
      std::memcpy(payload, &i, 8);
      if (!producer.write(1, payload, Deadline::after(std::chrono::seconds(30))).ok()) _exit(1);
    }
    _exit(0);
  }
  pin(1);
  auto ring = MpscRing::attach(region, bytes).value();
  uint64_t got = 0, reads = 0, errors = 0;
  go->store(1);
  const uint64_t t0 = mono_now_ns();
  const Deadline give_up = Deadline::after(std::chrono::seconds(120));
  while (got < kRecords && !give_up.passed()) {
    const size_t n = ring.read(
        [&](const MpscRecord& r) {
          uint64_t seq = 0;
          std::memcpy(&seq, r.payload.data(), 8);
          if (seq != got) ++errors;
          ++got;
        },
        SIZE_MAX);
    if (n > 0) {
      ++reads;
    } else {
      for (uint32_t k = 0; k < relax; ++k)
        cpu_relax();
    }
  }
  const uint64_t t1 = mono_now_ns();
  int status = 0;
  waitpid(child, &status, 0);
  std::printf("chase, %u pauses when empty: %.2f M/s, %.1f records a read, %lu out of order%s\n",
              relax, static_cast<double>(got) / (static_cast<double>(t1 - t0) / 1e3),
              reads ? static_cast<double>(got) / reads : 0.0, static_cast<unsigned long>(errors),
              got == kRecords && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "" : " (FAILED)");
  munmap(mapping, bytes + 4096);
}

}  // namespace

int main(int argc, char** argv) {
  alone();
  for (int i = 1; i < argc; ++i)
    chase(static_cast<uint32_t>(std::strtoul(argv[i], nullptr, 10)));
  if (argc == 1) chase(1);
  return 0;
}
