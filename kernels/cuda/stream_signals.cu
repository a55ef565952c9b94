#include "kernels/cuda/runtime.h"
#include "kernels/stream_signals.h"


namespace kvrelay::kernels {

namespace {

// One thread: the step's base + layer + 1 into the host word, after every
// write before it (this stream's earlier kernels: the layer's KV) is
// visible system-wide.
__global__ void signal_layer_kernel(const unsigned long long* step_base, unsigned int layer,
                                    unsigned long long* host_word) {
  const unsigned long long value =
      *reinterpret_cast<const volatile unsigned long long*>(step_base) + layer + 1;
  __threadfence_system();
  *reinterpret_cast<volatile unsigned long long*>(host_word) = value;
}

// Where cuStreamWriteValue64 is not supported on device memory: the same
// write as a kernel (its argument is taken at enqueue, like the write's).
__global__ void set_base_kernel(unsigned long long* step_base, unsigned long long base) {
  *step_base = base;
}

}  // namespace

Result<std::unique_ptr<LayerSignalWriter>> LayerSignalWriter::open(std::atomic<uint64_t>* word) {
  if (Status s = cuda::any_device(); !s) return s.error();
  std::unique_ptr<LayerSignalWriter> w(new LayerSignalWriter());
  if (Status s = cuda::check(cudaGetDevice(&w->device_), "cudaGetDevice"); !s) return s.error();
  // Loaded now, not at the first signal_layer: CUDA loads modules lazily,
  // and that first launch is usually inside the engine's graph capture.
  cudaFuncAttributes attributes{};
  for (const void* kernel : {reinterpret_cast<const void*>(&signal_layer_kernel),
                             reinterpret_cast<const void*>(&set_base_kernel)})
    if (Status s = cuda::check(cudaFuncGetAttributes(&attributes, kernel),
                               "loading the layer-signal kernels");
        !s)
      return s.error();
  Result<PinnedHostRange> pinned = PinnedHostRange::pin(word, sizeof(*word), /*mapped=*/true);
  if (!pinned) return pinned.error();
  w->pinned_ = std::move(pinned).value();
  w->device_word_ = reinterpret_cast<uint64_t*>(w->pinned_.device_address(word));
  void* base = nullptr;
  if (Status s = cuda::check(cudaMalloc(&base, sizeof(uint64_t)), "cudaMalloc of a step base"); !s)
    return s.error();
  w->step_base_ = static_cast<uint64_t*>(base);
  // Start where the word is: a restarted engine continues its count.
  const uint64_t now = word->load(std::memory_order_acquire);
  if (Status s = cuda::check(cudaMemcpy(base, &now, sizeof(now), cudaMemcpyHostToDevice),
                             "cudaMemcpy of a step base");
      !s)
    return s.error();
  return std::move(w);
}

LayerSignalWriter::~LayerSignalWriter() {
  if (step_base_ != nullptr) {
    (void)cudaSetDevice(device_);
    (void)cudaFree(step_base_);
  }
}

Status LayerSignalWriter::begin_step(void* stream, uint64_t base) {
  Result<const cuda::DriverApi*> api = cuda::driver_api();
  if (!api) return api.error();
  // A base captured into a graph changes at each replay's begin_step: only
  // one enqueued now is known to the host.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (Status s = cuda::check(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture),
                             "cudaStreamIsCapturing");
      !s)
    return s;
  host_step_base_ = base;
  step_base_known_ = capture == cudaStreamCaptureStatusNone;
  const CUresult r = (*api)->stream_write_value_64(static_cast<CUstream>(stream),
                                                   reinterpret_cast<CUdeviceptr>(step_base_), base,
                                                   CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r == CUDA_SUCCESS) return {};
  if (r != CUDA_ERROR_NOT_SUPPORTED) return cuda::check(r, "cuStreamWriteValue64 of a step base");
  set_base_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<unsigned long long*>(step_base_), base);
  return cuda::check(cudaGetLastError(), "launching the step-base write");
}

Status LayerSignalWriter::signal_layer(void* stream, uint32_t layer) {
  // Outside a capture the value is known now: one stream memory write,
  // whose default memory barrier orders it after the stream's earlier
  // writes as __threadfence_system() does. On an H200 it was seen by a
  // polling host thread 3 us sooner than the kernel (4.8 against 7.9 us
  // p50 after the same gate). A graph would replay the captured value, so
  // a capture takes the kernel, which reads the step's base when it runs.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (Status s = cuda::check(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture),
                             "cudaStreamIsCapturing");
      !s)
    return s;
  if (capture == cudaStreamCaptureStatusNone && step_base_known_ && host_writes_work_) {
    Result<const cuda::DriverApi*> api = cuda::driver_api();
    if (!api) return api.error();
    const CUresult r = (*api)->stream_write_value_64(
        static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(device_word_),
        host_step_base_ + layer + 1, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (r != CUDA_ERROR_NOT_SUPPORTED) return cuda::check(r, "cuStreamWriteValue64 of a layer signal");
    host_writes_work_ = false;  // this device cannot: the kernel from now on
  }
  signal_layer_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const unsigned long long*>(step_base_), layer,
      reinterpret_cast<unsigned long long*>(device_word_));
  return cuda::check(cudaGetLastError(), "launching a layer signal");
}

Status stream_wait_at_least(void* stream, const PinnedHostRange& pinned, const void* word,
                            uint64_t value) {
  Result<const cuda::DriverApi*> api = cuda::driver_api();
  if (!api) return api.error();
  return cuda::check(
      (*api)->stream_wait_value_64(static_cast<CUstream>(stream),
                                   static_cast<CUdeviceptr>(pinned.device_address(word)), value,
                                   CU_STREAM_WAIT_VALUE_GEQ),
      "cuStreamWaitValue64");
}

}  // namespace kvrelay::kernels
