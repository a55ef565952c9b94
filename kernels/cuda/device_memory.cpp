#include "kernels/device_memory.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>

#include "kernels/cuda/runtime.h"

namespace kvrelay::kernels {

Result<ImportedDeviceMemory> ImportedDeviceMemory::open_ipc(int device,
                                                            std::span<const std::byte> handle,
                                                            uint64_t bytes) {
  if (Status s = cuda::use_device(device); !s) return s.error();
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h))
    return make_error(Errc::kInvalidArgument, fmt::format("a CUDA IPC handle is {} bytes, not {}",
                                                          sizeof(h), handle.size()));
  std::memcpy(&h, handle.data(), sizeof(h));
  void* base = nullptr;
  if (Status s = cuda::check(cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess),
                             "cudaIpcOpenMemHandle");
      !s) {
    (void)cudaGetLastError();
    return s.error();
  }
  ImportedDeviceMemory m;
  m.kind_ = Kind::kIpc;
  m.device_ = device;
  m.base_ = static_cast<std::byte*>(base);
  m.bytes_ = bytes;
  // The handle names a whole cudaMalloc allocation: it must hold what the
  // engine says it does, or copies would run off its end.
  Result<const cuda::DriverApi*> api = cuda::driver_api();
  if (!api) return api.error();
  CUdeviceptr start = 0;
  size_t size = 0;
  if (Status s = cuda::check(
          (*api)->mem_get_address_range(&start, &size, reinterpret_cast<CUdeviceptr>(base)),
          "cuMemGetAddressRange");
      !s)
    return s.error();
  if (size < bytes)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("the CUDA IPC allocation has {} bytes, not the {} its "
                                  "registration says",
                                  size, bytes));
  return m;
}

Result<ImportedDeviceMemory> ImportedDeviceMemory::open_vmm(int device, int fd, uint64_t bytes) {
  if (Status s = cuda::use_device(device); !s) return s.error();
  Result<const cuda::DriverApi*> loaded = cuda::driver_api();
  if (!loaded) return loaded.error();
  const cuda::DriverApi& api = **loaded;
  ImportedDeviceMemory m;
  m.device_ = device;
  CUmemGenericAllocationHandle handle = 0;
  if (Status s = cuda::check(api.mem_import_from_shareable_handle(
                                 &handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                             "cuMemImportFromShareableHandle");
      !s)
    return s.error();
  m.kind_ = Kind::kVmm;
  m.vmm_handle_ = handle;
  CUmemAllocationProp prop{};
  if (Status s = cuda::check(api.mem_get_allocation_properties_from_handle(&prop, handle),
                             "cuMemGetAllocationPropertiesFromHandle");
      !s)
    return s.error();
  CUdeviceptr address = 0;
  if (Status s = cuda::check(api.mem_address_reserve(&address, bytes, 0, 0, 0),
                             fmt::format("cuMemAddressReserve of {} bytes", bytes));
      !s)
    return s.error();
  m.base_ = reinterpret_cast<std::byte*>(address);
  m.bytes_ = bytes;
  if (Status s =
          cuda::check(api.mem_map(address, bytes, 0, handle, 0),
                      fmt::format("cuMemMap of {} bytes (is that the allocation's size?)", bytes));
      !s) {
    (void)api.mem_address_free(address, bytes);
    m.base_ = nullptr;
    return s.error();
  }
  // Read and write from the GPU this worker copies with (peer access when
  // the allocation lives on another one), and from the owner's.
  CUmemAccessDesc access[2]{};
  int n = 0;
  for (int d : {device, prop.location.id}) {
    if (n == 1 && d == device) break;
    access[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[n].location.id = d;
    access[n].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ++n;
  }
  if (Status s = cuda::check(api.mem_set_access(address, bytes, access, static_cast<size_t>(n)),
                             "cuMemSetAccess");
      !s)
    return s.error();
  return m;
}

ImportedDeviceMemory::ImportedDeviceMemory(ImportedDeviceMemory&& o) noexcept
    : kind_(std::exchange(o.kind_, Kind::kNone)),
      device_(o.device_),
      base_(std::exchange(o.base_, nullptr)),
      bytes_(o.bytes_),
      vmm_handle_(std::exchange(o.vmm_handle_, 0)) {}

ImportedDeviceMemory& ImportedDeviceMemory::operator=(ImportedDeviceMemory&& o) noexcept {
  if (this != &o) {
    release();
    kind_ = std::exchange(o.kind_, Kind::kNone);
    device_ = o.device_;
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = o.bytes_;
    vmm_handle_ = std::exchange(o.vmm_handle_, 0);
  }
  return *this;
}

ImportedDeviceMemory::~ImportedDeviceMemory() {
  release();
}

void ImportedDeviceMemory::release() {
  if (kind_ == Kind::kNone) return;
  (void)cudaSetDevice(device_);
  if (kind_ == Kind::kIpc && base_ != nullptr) (void)cudaIpcCloseMemHandle(base_);
  if (kind_ == Kind::kVmm) {
    if (Result<const cuda::DriverApi*> api = cuda::driver_api(); api) {
      const auto address = reinterpret_cast<CUdeviceptr>(base_);
      if (base_ != nullptr) {
        (void)(*api)->mem_unmap(address, bytes_);
        (void)(*api)->mem_address_free(address, bytes_);
      }
      (void)(*api)->mem_release(vmm_handle_);
    }
  }
  kind_ = Kind::kNone;
  base_ = nullptr;
}

}  // namespace kvrelay::kernels
