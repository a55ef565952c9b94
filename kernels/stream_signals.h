// Signals between a GPU stream and host memory that other processes watch,
// with no host thread in between: what lets an engine that captures its
// forward pass in CUDA graphs tell kvrelay a layer is written, and lets its
// stream wait for a swapped-in layer.
//
// Layer signals. A rank's signal word (in the control segment) counts
// layers: the worker sends layer l of a step once the word reaches
// base + l + 1, where `base` is what the step's record says. The stream
// writes it in two parts, because a CUDA graph replays the values it
// captured:
//   begin_step(stream, base)   cuStreamWriteValue64 of `base` into a device
//                              word, enqueued by the host before each step
//                              (outside any graph)
//   signal_layer(stream, l)    a one-thread kernel, capturable: writes
//                              device word + l + 1 into the host word, after
//                              a system-wide fence; outside a capture, a
//                              cuStreamWriteValue64 of base + l + 1 (its
//                              default barrier is the same fence), 3 us
//                              sooner on an H200
// so a graph captured once signals every replay correctly, and a replay
// whose begin_step was forgotten repeats old values: the worker waits,
// and never sends a layer early.
//
// Waits. stream_wait(stream, word, value) enqueues cuStreamWaitValue64
// (>=) on a word of pinned, mapped host memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "kernels/host_pinning.h"
#include "shm/result.h"

namespace kvrelay::kernels {

class LayerSignalWriter {
 public:
  // For the host word `word` (shared memory the worker reads), on the
  // current CUDA device.
  static Result<std::unique_ptr<LayerSignalWriter>> open(std::atomic<uint64_t>* word);
  ~LayerSignalWriter();
  LayerSignalWriter(const LayerSignalWriter&) = delete;
  LayerSignalWriter& operator=(const LayerSignalWriter&) = delete;

  Status begin_step(void* stream, uint64_t base);
  Status signal_layer(void* stream, uint32_t layer);

 private:
  LayerSignalWriter() = default;
  // [[maybe_unused]]: a build without CUDA (no_cuda.cpp) never reads them.
  PinnedHostRange pinned_;
  [[maybe_unused]] uint64_t* device_word_ = nullptr;  // the host word's device address
  [[maybe_unused]] uint64_t* step_base_ = nullptr;    // device memory: the current step's base
  [[maybe_unused]] int device_ = 0;
  // The last begin_step's base, for a signal_layer outside a graph capture
  // (a stream memory write of the value itself, not the kernel).
  [[maybe_unused]] uint64_t host_step_base_ = 0;
  [[maybe_unused]] bool step_base_known_ = false;
  [[maybe_unused]] bool host_writes_work_ = true;  // false once the driver said not supported
};

// Enqueues on `stream` a wait until the 64-bit word at `word` (inside
// `pinned`, pinned mapped) is at least `value`.
Status stream_wait_at_least(void* stream, const PinnedHostRange& pinned, const void* word,
                            uint64_t value);

}  // namespace kvrelay::kernels
