#include "kernels/host_pinning.h"

#include <fmt/format.h>
#include <unistd.h>

#include <utility>

#include "kernels/cuda/runtime.h"
#include "kernels/pin_registry.h"

namespace kvrelay::kernels {

PinRegistry& PinRegistry::process() {
  static PinRegistry registry(
      [](Pages& p) -> Status {
        if (p.device >= 0) {
          if (Status s = cuda::use_device(p.device); !s) return s;
        }
        // Portable: every device and context of the process sees it pinned.
        const unsigned flags = cudaHostRegisterPortable | (p.mapped ? cudaHostRegisterMapped : 0U);
        void* base = reinterpret_cast<void*>(p.start);
        if (Status s = cuda::check(cudaHostRegister(base, p.end - p.start, flags),
                                   fmt::format("cudaHostRegister of {} bytes", p.end - p.start));
            !s) {
          (void)cudaGetLastError();
          return s;
        }
        if (p.mapped) {
          void* device_address = nullptr;
          if (Status s = cuda::check(cudaHostGetDevicePointer(&device_address, base, 0),
                                     "cudaHostGetDevicePointer");
              !s) {
            (void)cudaHostUnregister(base);
            return s;
          }
          p.device_base = reinterpret_cast<uint64_t>(device_address);
        }
        return {};
      },
      [](const Pages& p) {
        // Possibly on another thread than pin()'s (a connection's last
        // owner): the same GPU's context, not GPU 0's.
        if (p.device >= 0) (void)cudaSetDevice(p.device);
        (void)cudaHostUnregister(reinterpret_cast<void*>(p.start));
      });
  return registry;
}

Result<PinnedHostRange> PinnedHostRange::pin(void* address, size_t bytes, bool mapped, int device) {
  if (Status s = device < 0 ? cuda::any_device() : cuda::use_device(device); !s)
    return make_error(s.code(),
                      fmt::format("cannot pin host memory for a GPU: {}", s.error().message));
  // cudaHostRegister wants whole pages on some drivers: register the pages
  // that hold the range (shared, counted, with whatever else this process
  // pinned on them: pin_registry.h).
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(address) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(address) + bytes + page - 1) & ~(page - 1);
  Result<PinRegistry::Pages> pages = PinRegistry::process().pin(start, end, mapped, device);
  if (!pages) return pages.error();
  PinnedHostRange r;
  r.base_ = reinterpret_cast<void*>(pages->start);
  r.bytes_ = pages->end - pages->start;
  r.device_base_ = pages->device_base;
  return r;
}

PinnedHostRange::PinnedHostRange(PinnedHostRange&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      bytes_(other.bytes_),
      device_base_(other.device_base_) {}

PinnedHostRange& PinnedHostRange::operator=(PinnedHostRange&& other) noexcept {
  if (this != &other) {
    release();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = other.bytes_;
    device_base_ = other.device_base_;
  }
  return *this;
}

PinnedHostRange::~PinnedHostRange() {
  release();
}

void PinnedHostRange::release() {
  if (base_ == nullptr) return;
  PinRegistry::process().release(reinterpret_cast<uintptr_t>(base_));
  base_ = nullptr;
}

}  // namespace kvrelay::kernels
