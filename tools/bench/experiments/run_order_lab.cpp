// Experiment behind kernels/run_order.h's table: a request of 32 MiB in
// blocks of the given KiB, picked at random from pools 1, 2, 4, 10 and 20
// times its size (both sides), copied in the request's order with streaming
// stores against copy_runs_host (which sorts by source where run_order.h
// says so; the sort is inside the timing). Each trial evicts the
// destination first; 15 alternating trials, medians.
// Not built by CMake (one-off); from the project root:
//   g++ -O2 -std=c++20 -I. tools/bench/experiments/run_order_lab.cpp \
//     kernels/block_copy_host.cpp kernels/run_order.cpp kernels/streaming_copy.cpp \
//     -o run_order_lab && ./run_order_lab 16
#include <sys/mman.h>
#include <x86intrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/block_copy.h"
#include "kernels/streaming_copy.h"

using namespace kvrelay::kernels;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::byte* map_bytes(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) std::exit(1);
  return static_cast<std::byte*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t block = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 16) * 1024;
  const uint64_t request_bytes = uint64_t{32} << 20;
  const uint64_t request_blocks = request_bytes / block;
  for (const double share : {1.0, 0.5, 0.25, 0.1, 0.05}) {
    const auto pool_blocks = static_cast<uint64_t>(static_cast<double>(request_blocks) / share);
    std::byte* src = map_bytes(pool_blocks * block);
    std::byte* dst = map_bytes(pool_blocks * block);
    std::memset(src, 1, pool_blocks * block);
    std::memset(dst, 0, pool_blocks * block);
    std::vector<uint64_t> from(pool_blocks), to(pool_blocks);
    std::iota(from.begin(), from.end(), 0);
    std::iota(to.begin(), to.end(), 0);
    std::mt19937 rng(42);
    std::shuffle(from.begin(), from.end(), rng);
    std::shuffle(to.begin(), to.end(), rng);
    std::vector<CopyRun> runs(request_blocks);
    for (uint64_t i = 0; i < request_blocks; ++i)
      runs[i] = {from[i] * block, to[i] * block, block};
    std::vector<double> given, sorted;
    for (int trial = 0; trial < 15; ++trial) {
      for (int which = 0; which < 2; ++which) {
        for (uint64_t i = 0; i < pool_blocks * block; i += 64)
          _mm_clflush(dst + i);
        _mm_mfence();
        const double t0 = now_s();
        if (which == 0) {
          for (const CopyRun& r : runs)
            streaming_copy(dst + r.dst_offset, src + r.src_offset, r.bytes);
          streaming_copy_fence();
        } else {
          copy_runs_host(src, dst, runs);
        }
        const double gbps = static_cast<double>(request_bytes) / (now_s() - t0) / 1e9;
        (which == 0 ? given : sorted).push_back(gbps);
      }
    }
    std::sort(given.begin(), given.end());
    std::sort(sorted.begin(), sorted.end());
    std::printf(
        "%3llu KiB blocks, %3.0f%% of the pool: request order %.2f GB/s, "
        "copy_runs_host %.2f GB/s (%.2fx)\n",
        static_cast<unsigned long long>(block / 1024), share * 100, given[7], sorted[7],
        sorted[7] / given[7]);
    munmap(src, pool_blocks * block);
    munmap(dst, pool_blocks * block);
  }
  return 0;
}
