#include "kernels/stream_marks.h"

#include <cuda_runtime_api.h>

#include <thread>

#include "kernels/cuda/runtime.h"

namespace kvrelay::kernels {

StreamMarks::~StreamMarks() {
  for (const Mark& m : marks_) {
    (void)cudaSetDevice(m.device);
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(m.event));
  }
}

Status StreamMarks::mark(void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (Status st = cuda::check(cudaStreamIsCapturing(s, &capturing), "cudaStreamIsCapturing"); !st)
    return st;
  if (capturing != cudaStreamCaptureStatusNone) return {};
  std::lock_guard lock(mu_);
  Mark* mark = nullptr;
  for (Mark& m : marks_)
    if (m.stream == stream) mark = &m;
  if (mark == nullptr) {
    Mark m;
    m.stream = stream;
    if (Status st = cuda::check(cudaGetDevice(&m.device), "cudaGetDevice"); !st) return st;
    cudaEvent_t event = nullptr;
    if (Status st = cuda::check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                "cudaEventCreateWithFlags (a mark of the client's stream work)");
        !st)
      return st;
    m.event = event;
    marks_.push_back(m);
    mark = &marks_.back();
  }
  return cuda::check(cudaEventRecord(static_cast<cudaEvent_t>(mark->event), s),
                     "cudaEventRecord (a mark of the client's stream work)");
}

bool StreamMarks::done_within(std::chrono::milliseconds wait) {
  const auto until = std::chrono::steady_clock::now() + wait;
  std::lock_guard lock(mu_);
  for (const Mark& m : marks_) {
    for (;;) {
      const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(m.event));
      if (r == cudaSuccess) break;
      if (r != cudaErrorNotReady) {
        (void)cudaGetLastError();
        return false;  // the context is broken: nothing can be said to be done
      }
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return true;
}

size_t StreamMarks::streams() const {
  std::lock_guard lock(mu_);
  return marks_.size();
}

}  // namespace kvrelay::kernels
