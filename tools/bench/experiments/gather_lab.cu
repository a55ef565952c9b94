// Experiment behind docs/gpu.md's gather table: device->device gather of
// 16,384 scattered 16 KiB blocks (256 MiB) on 16 SMs and on all, as the
// product kernel does it (a warp per slice, launches of 1,280 or one launch),
// with deeper unrolling, and with TMA bulk copies through shared memory.
// Timed with CUDA events (median of 7); every block checked after each case.
// Not built by CMake (one-off, sm_90 only):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -o gather_lab gather_lab.cu
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <numeric>
#include <random>
#include <cstring>
#include <cstdlib>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)

struct Slice { uint64_t src, dst, bytes; };

template <int U>
__global__ void __launch_bounds__(1024) warp_kernel(const Slice* slices, uint32_t count) {
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const uint32_t warps = gridDim.x * blockDim.x / 32;
  for (uint32_t s = warp; s < count; s += warps) {
    const Slice sl = slices[s];
    const ulonglong2* src = reinterpret_cast<const ulonglong2*>(sl.src);
    ulonglong2* dst = reinterpret_cast<ulonglong2*>(sl.dst);
    const uint64_t n = sl.bytes / 16;
    uint64_t i = lane;
    for (; i + 32 * (U - 1) < n; i += 32 * U) {
      ulonglong2 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = __ldg(src + i + u * 32);
#pragma unroll
      for (int u = 0; u < U; ++u) dst[i + u * 32] = v[u];
    }
    for (; i < n; i += 32) dst[i] = __ldg(src + i);
  }
}

// TMA (bulk async copy) pipes: lane 0 of each warp runs one pipe with its
// own `stages` buffers of `chunk` bytes in shared memory.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__global__ void bulk_kernel(const Slice* slices, uint32_t count, uint32_t chunk, uint32_t stages) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t warp_in_block = threadIdx.x / 32;
  const uint32_t warps_per_block = blockDim.x / 32;
  const uint32_t lane = threadIdx.x % 32;
  // barriers first, then buffers
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);
  unsigned char* bufs = smem + 128 * ((warps_per_block * stages * 8 + 127) / 128);
  if (lane == 0)
    for (uint32_t st = 0; st < stages; ++st) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bars[warp_in_block * stages + st])));
    }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
  if (lane != 0) return;
  const uint32_t pipe = blockIdx.x * warps_per_block + warp_in_block;
  const uint32_t pipes = gridDim.x * warps_per_block;
  uint32_t phase_bits = 0;  // one parity bit per stage
  uint32_t stage = 0;
  // pending: the loads issued but not yet stored, per stage
  uint64_t pend_dst[8] = {};
  uint32_t pend_bytes[8] = {};
  uint32_t inflight = 0;
  auto drain_one = [&](uint32_t st) {
    const uint32_t bar = smem_addr(&bars[warp_in_block * stages + st]);
    const uint32_t parity = (phase_bits >> st) & 1;
    asm volatile(
        "{\n.reg .pred P1;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        "@P1 bra.uni DONE_%=;\nbra.uni WAIT_%=;\nDONE_%=:\n}\n" ::"r"(bar),
        "r"(parity) : "memory");
    phase_bits ^= 1u << st;
    const uint32_t buf = smem_addr(bufs + (uint64_t(warp_in_block) * stages + st) * chunk);
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(pend_dst[st]),
                 "r"(buf), "r"(pend_bytes[st]) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  };
  for (uint32_t s = pipe; s < count; s += pipes) {
    const Slice sl = slices[s];
    for (uint64_t off = 0; off < sl.bytes; off += chunk) {
      const uint32_t bytes = static_cast<uint32_t>(sl.bytes - off < chunk ? sl.bytes - off : chunk);
      if (inflight == stages) {
        // the oldest stage: `stage` (ring order)
        drain_one(stage);
        --inflight;
        // its buffer is free for a new load once its store has read it:
        // allow the (stages-1) later stores to stay pending? only the newest
        // groups can be pending; wait until at most 0 outstanding reads for safety
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
      }
      const uint32_t bar = smem_addr(&bars[warp_in_block * stages + stage]);
      const uint32_t buf = smem_addr(bufs + (uint64_t(warp_in_block) * stages + stage) * chunk);
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(buf),
          "l"(sl.src + off), "r"(bytes), "r"(bar) : "memory");
      pend_dst[stage] = sl.dst + off;
      pend_bytes[stage] = bytes;
      ++inflight;
      stage = (stage + 1) % stages;
    }
  }
  // drain the rest, oldest first
  uint32_t st = (stage + stages - inflight) % stages;
  while (inflight > 0) {
    drain_one(st);
    st = (st + 1) % stages;
    --inflight;
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}

int main(int argc, char** argv) {
  const uint64_t block = 16 << 10, bytes = 512ull << 20, nblocks = bytes / block;
  std::vector<uint64_t> si(nblocks), di(nblocks);
  std::iota(si.begin(), si.end(), 0);
  std::iota(di.begin(), di.end(), 0);
  std::mt19937_64 rng(2);
  std::shuffle(si.begin(), si.end(), rng);
  std::shuffle(di.begin(), di.end(), rng);
  unsigned char *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  std::vector<unsigned char> host(bytes);
  for (uint64_t i = 0; i < bytes; i += 8) { uint64_t v = i * 0x9E3779B97F4A7C15ull; memcpy(&host[i], &v, 8); }
  CK(cudaMemcpy(a, host.data(), bytes, cudaMemcpyHostToDevice));
  std::vector<Slice> sl;
  for (uint64_t i = 0; i < nblocks / 2; ++i) sl.push_back({uint64_t(a) + si[i] * block, uint64_t(b) + di[i] * block, block});
  const uint64_t moved = sl.size() * block;
  Slice* dsl;
  CK(cudaMalloc(&dsl, sl.size() * sizeof(Slice)));
  CK(cudaMemcpy(dsl, sl.data(), sl.size() * sizeof(Slice), cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  std::vector<unsigned char> got(bytes);
  auto verify = [&](const char* name) {
    CK(cudaMemcpy(got.data(), b, bytes, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < nblocks / 2; ++i)
      if (memcmp(&got[di[i] * block], &host[si[i] * block], block) != 0) { printf("  %s: WRONG at slice %lu\n", name, i); return false; }
    return true;
  };
  auto timeit = [&](const char* name, auto launch, bool scattered = true) {
    std::vector<float> t;
    CK(cudaMemset(b, 0, bytes));
    for (int i = 0; i < 7; ++i) {
      CK(cudaEventRecord(e0));
      launch();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      CK(cudaGetLastError());
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    bool ok = !scattered || verify(name);
    printf("%-52s %8.1f GB/s %s\n", name, moved / (t[3] * 1e-3) / 1e9, ok ? "ok" : "WRONG");
    fflush(stdout);
  };
  timeit("cudaMemcpy D2D one large", [&] { CK(cudaMemcpyAsync(b, a, moved, cudaMemcpyDeviceToDevice)); }, false);
  for (int blocks : {16, sms}) {
    char name[128];
    for (int per : {1280, 1 << 30}) {
      snprintf(name, sizeof name, "warp U4 1024t %d blk, launches of %d", blocks, std::min<int>(per, sl.size()));
      timeit(name, [&] {
        for (size_t f = 0; f < sl.size(); f += per) {
          uint32_t c = std::min<size_t>(per, sl.size() - f);
          warp_kernel<4><<<std::min<uint32_t>(blocks, (c + 31) / 32), 1024>>>(dsl + f, c);
        }
      });
    }
    snprintf(name, sizeof name, "warp U8 1024t %d blk, one launch", blocks);
    timeit(name, [&] { warp_kernel<8><<<blocks, 1024>>>(dsl, sl.size()); });
    snprintf(name, sizeof name, "warp U16 512t %d blk, one launch", blocks);
    timeit(name, [&] { warp_kernel<16><<<blocks, 512>>>(dsl, sl.size()); });
    struct Cfg { uint32_t warps, chunk, stages; };
    for (Cfg c : {Cfg{12, 16384, 1}, Cfg{6, 16384, 2}, Cfg{4, 16384, 3}, Cfg{12, 8192, 2}, Cfg{24, 8192, 1}, Cfg{8, 4096, 6}, Cfg{16, 4096, 3}}) {
      const uint32_t smem = 128 * ((c.warps * c.stages * 8 + 127) / 128) + c.warps * c.stages * c.chunk;
      snprintf(name, sizeof name, "bulk %u pipes x %u x %u KiB, %d blk", c.warps, c.stages, c.chunk >> 10, blocks);
      timeit(name, [&] { bulk_kernel<<<blocks, c.warps * 32, smem>>>(dsl, sl.size(), c.chunk, c.stages); });
    }
  }
  return 0;
}
