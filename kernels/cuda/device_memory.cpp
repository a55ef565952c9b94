#include "kernels/device_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

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

Result<ImportedDeviceMemory> ImportedDeviceMemory::open_vmm(int device,
                                                            std::span<const VmmPiece> pieces,
                                                            uint64_t bytes) {
  if (Status s = cuda::use_device(device); !s) return s.error();
  Result<const cuda::DriverApi*> loaded = cuda::driver_api();
  if (!loaded) return loaded.error();
  const cuda::DriverApi& api = **loaded;
  ImportedDeviceMemory m;  // undoes whatever was done if a step fails
  m.kind_ = Kind::kVmm;
  m.device_ = device;
  m.bytes_ = bytes;
  CUdeviceptr address = 0;
  if (Status s = cuda::check(api.mem_address_reserve(&address, bytes, 0, 0, 0),
                             fmt::format("cuMemAddressReserve of {} bytes", bytes));
      !s)
    return s.error();
  m.base_ = reinterpret_cast<std::byte*>(address);
  m.reserved_ = true;
  std::vector<int> owners;  // the GPUs the allocations live on
  for (const VmmPiece& p : pieces) {
    CUmemGenericAllocationHandle handle = 0;
    if (Status s = cuda::check(api.mem_import_from_shareable_handle(
                                   &handle, reinterpret_cast<void*>(static_cast<intptr_t>(p.fd)),
                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                               "cuMemImportFromShareableHandle");
        !s)
      return s.error();
    CUmemAllocationProp prop{};
    if (Status s = cuda::check(api.mem_get_allocation_properties_from_handle(&prop, handle),
                               "cuMemGetAllocationPropertiesFromHandle");
        !s) {
      (void)api.mem_release(handle);
      return s.error();
    }
    if (Status s = cuda::check(api.mem_map(address + p.offset, p.bytes, 0, handle, 0),
                               fmt::format("cuMemMap of {} bytes at +{} (is that the "
                                           "allocation's size?)",
                                           p.bytes, p.offset));
        !s) {
      (void)api.mem_release(handle);
      return s.error();
    }
    m.vmm_.push_back(Mapped{handle, p.offset, p.bytes});
    if (std::find(owners.begin(), owners.end(), prop.location.id) == owners.end())
      owners.push_back(prop.location.id);
  }
  // Read and write from the GPU this worker copies with (peer to peer when
  // the memory lives on another one) and from the owners'. Without peer
  // access (PCIe GPUs across CPU sockets, or with P2P disabled) the copy
  // kernel would fault on the first write: say so now.
  for (int owner : owners) {
    if (owner == device) continue;
    int reachable = 0;
    if (Status s = cuda::check(cudaDeviceCanAccessPeer(&reachable, device, owner),
                               "cudaDeviceCanAccessPeer");
        !s)
      return s.error();
    if (reachable == 0)
      return make_error(Errc::kUnsupported,
                        fmt::format("GPU {} (this rank's) cannot reach GPU {} (where the pool "
                                    "lives) peer to peer, which ipc between GPUs needs (NVLink, "
                                    "or PCIe P2P): connect these instances over tcp instead",
                                    device, owner));
  }
  if (std::find(owners.begin(), owners.end(), device) == owners.end()) owners.push_back(device);
  std::vector<CUmemAccessDesc> access(owners.size());
  for (size_t i = 0; i < owners.size(); ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = owners[i];
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  if (Status s = cuda::check(api.mem_set_access(address, bytes, access.data(), access.size()),
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
      vmm_(std::exchange(o.vmm_, {})),
      reserved_(std::exchange(o.reserved_, false)) {}

ImportedDeviceMemory& ImportedDeviceMemory::operator=(ImportedDeviceMemory&& o) noexcept {
  if (this != &o) {
    release();
    kind_ = std::exchange(o.kind_, Kind::kNone);
    device_ = o.device_;
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = o.bytes_;
    vmm_ = std::exchange(o.vmm_, {});
    reserved_ = std::exchange(o.reserved_, false);
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
      for (const Mapped& m : vmm_) {
        (void)(*api)->mem_unmap(address + m.offset, m.bytes);
        (void)(*api)->mem_release(m.handle);
      }
      if (reserved_) (void)(*api)->mem_address_free(address, bytes_);
    }
    vmm_.clear();
    reserved_ = false;
  }
  kind_ = Kind::kNone;
  base_ = nullptr;
}

}  // namespace kvrelay::kernels
