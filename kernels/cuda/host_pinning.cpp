#include "kernels/host_pinning.h"

#include <fmt/format.h>
#include <unistd.h>

#include <utility>

#include "kernels/cuda/runtime.h"

namespace kvrelay::kernels {

Result<PinnedHostRange> PinnedHostRange::pin(void* address, size_t bytes, bool mapped, int device) {
  if (Status s = device < 0 ? cuda::any_device() : cuda::use_device(device); !s)
    return make_error(s.code(),
                      fmt::format("cannot pin host memory for a GPU: {}", s.error().message));
  // cudaHostRegister wants whole pages on some drivers: register the pages
  // that hold the range.
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(address) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(address) + bytes + page - 1) & ~(page - 1);
  PinnedHostRange r;
  r.base_ = reinterpret_cast<void*>(start);
  r.bytes_ = end - start;
  r.device_ = device;
  // Portable: every device and context of the process sees it pinned.
  unsigned flags = cudaHostRegisterPortable | (mapped ? cudaHostRegisterMapped : 0U);
  if (Status s = cuda::check(cudaHostRegister(r.base_, r.bytes_, flags),
                             fmt::format("cudaHostRegister of {} bytes", r.bytes_));
      !s) {
    (void)cudaGetLastError();
    r.base_ = nullptr;
    return s.error();
  }
  if (mapped) {
    void* device_address = nullptr;
    if (Status s = cuda::check(cudaHostGetDevicePointer(&device_address, r.base_, 0),
                               "cudaHostGetDevicePointer");
        !s)
      return s.error();  // r unregisters
    r.device_base_ = reinterpret_cast<uint64_t>(device_address);
  }
  return r;
}

PinnedHostRange::PinnedHostRange(PinnedHostRange&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      bytes_(other.bytes_),
      device_base_(other.device_base_),
      device_(other.device_) {}

PinnedHostRange& PinnedHostRange::operator=(PinnedHostRange&& other) noexcept {
  if (this != &other) {
    release();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = other.bytes_;
    device_base_ = other.device_base_;
    device_ = other.device_;
  }
  return *this;
}

PinnedHostRange::~PinnedHostRange() {
  release();
}

void PinnedHostRange::release() {
  if (base_ == nullptr) return;
  // Possibly on another thread than pin()'s (a connection's last owner):
  // the same GPU's context, not GPU 0's.
  if (device_ >= 0) (void)cudaSetDevice(device_);
  (void)cudaHostUnregister(base_);
  base_ = nullptr;
}

}  // namespace kvrelay::kernels
