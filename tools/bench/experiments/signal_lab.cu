// Experiment behind docs/gpu.md's signal table: where the GPU->host layer
// signal's 9.5 us goes. The stream waits on a gate word in host memory; the
// host opens it and times until it sees the signal word change (1000
// samples per way of writing it). Not built by CMake:
//   nvcc -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -o signal_lab signal_lab.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sys/mman.h>
#define CK(x) do { auto e = (x); if (e != 0) { printf("%s: %d\n", #x, int(e)); exit(1);} } while (0)
static uint64_t now_ns() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000ull + t.tv_nsec; }
__global__ void write_kernel(const unsigned long long* base, unsigned long long* w, int read_base) {
  unsigned long long v = read_base ? *(volatile const unsigned long long*)base + 1 : 0;
  if (!read_base) v = *(volatile unsigned long long*)w + 1;
  __threadfence_system();
  *(volatile unsigned long long*)w = v;
}
__global__ void noop() {}
int main() {
  CK(cudaFree(0));
  { cudaFuncAttributes fa; CK(cudaFuncGetAttributes(&fa, write_kernel)); }
  void* pages = mmap(nullptr, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  auto* words = static_cast<std::atomic<uint64_t>*>(pages);
  for (int i = 0; i < 3 * 512; ++i) words[i].store(0);
  CK(cudaHostRegister(pages, 3 * 4096, cudaHostRegisterMapped | cudaHostRegisterPortable));
  std::atomic<uint64_t>& gate = words[0];
  std::atomic<uint64_t>& word = words[512];
  CUdeviceptr dgate, dword;
  void* p;
  CK(cudaHostGetDevicePointer(&p, &gate, 0)); dgate = (CUdeviceptr)p;
  CK(cudaHostGetDevicePointer(&p, &word, 0)); dword = (CUdeviceptr)p;
  unsigned long long* base;
  CK(cudaMalloc(&base, 8));
  CK(cudaMemset(base, 0, 8));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint64_t opened = 0;
  const char* names[] = {"gate -> cuStreamWriteValue64 to the host word (floor)",
                         "gate -> 1-thread kernel writes the host word",
                         "gate -> WriteValue64 base, kernel reads base, writes (ours)",
                         "no gate: kernel launch -> host word (launch+write)"};
  for (int mode = 0; mode < 4; ++mode) {
    std::vector<double> us;
    for (int i = 0; i < 1000; ++i) {
      ++opened;
      const uint64_t before = word.load();
      if (mode != 3) CK(cuStreamWaitValue64(s, dgate, opened, CU_STREAM_WAIT_VALUE_GEQ));
      if (mode == 0) CK(cuStreamWriteValue64(s, dword, before + 1, 0));
      if (mode == 1) write_kernel<<<1, 1, 0, s>>>(base, (unsigned long long*)dword, 0);
      if (mode == 2) {
        CK(cuStreamWriteValue64(s, (CUdeviceptr)base, before, 0));
        write_kernel<<<1, 1, 0, s>>>(base, (unsigned long long*)dword, 1);
      }
      uint64_t t0;
      if (mode != 3) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        t0 = now_ns();
        gate.store(opened, std::memory_order_release);
      } else {
        t0 = now_ns();
        write_kernel<<<1, 1, 0, s>>>(base, (unsigned long long*)dword, 0);
      }
      while (word.load(std::memory_order_acquire) == before) {}
      us.push_back((now_ns() - t0) / 1e3);
      CK(cudaStreamSynchronize(s));
    }
    std::sort(us.begin(), us.end());
    printf("%-62s p50 %6.2f us  p90 %6.2f  p99 %6.2f\n", names[mode], us[500], us[900], us[990]);
  }
  return 0;
}
