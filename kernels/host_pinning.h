// Page-locking host memory for a GPU (cudaHostRegister), so that copies
// between it and the device run on the copy engines at full speed and
// asynchronously. A host pool that a GPU touches is pinned once, for as long
// as the pairing lives; a word the GPU writes (a layer signal) is pinned
// mapped, with a device address the GPU's stream can write to.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shm/result.h"

namespace kvrelay::kernels {

class PinnedHostRange {
 public:
  // Pins the pages that hold [address, address + bytes). With `mapped`, the
  // range also gets a device address (device_address()). Pages this process
  // pinned already are shared, counted, and unpinned by their last user
  // (pin_registry.h): two ranks' signal words on one page pin it once.
  // kUnsupported without CUDA.
  //
  // `device`: the GPU whose context registers (and later unregisters) it,
  // made the calling thread's current device first. Needed on any thread
  // that never chose one (a network thread): CUDA would use GPU 0 there and
  // create a context on it, hundreds of MiB of GPU 0's memory for every
  // worker of the host. -1: the calling thread's current device.
  static Result<PinnedHostRange> pin(void* address, size_t bytes, bool mapped = false,
                                     int device = -1);

  PinnedHostRange() = default;
  PinnedHostRange(PinnedHostRange&& other) noexcept;
  PinnedHostRange& operator=(PinnedHostRange&& other) noexcept;
  PinnedHostRange(const PinnedHostRange&) = delete;
  PinnedHostRange& operator=(const PinnedHostRange&) = delete;
  ~PinnedHostRange();

  bool pinned() const { return base_ != nullptr; }
  // The device address of host address `address` inside the range (mapped only).
  uint64_t device_address(const void* address) const {
    return device_base_ +
           (reinterpret_cast<uintptr_t>(address) - reinterpret_cast<uintptr_t>(base_));
  }

 private:
  void release();
  void* base_ = nullptr;               // page-aligned start of what was registered
  [[maybe_unused]] size_t bytes_ = 0;  // unread in a build without CUDA
  uint64_t device_base_ = 0;
};

}  // namespace kvrelay::kernels
