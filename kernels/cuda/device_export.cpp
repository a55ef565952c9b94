#include "kernels/device_export.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>

#include "kernels/cuda/runtime.h"
#include "kernels/gpu_identity.h"

namespace kvrelay::kernels {

namespace {

template <class T>
Result<T> attribute(const cuda::DriverApi& api, CUpointer_attribute what, uint64_t address,
                    const char* name) {
  T value{};
  if (Status s = cuda::check(
          api.pointer_get_attribute(&value, what, static_cast<CUdeviceptr>(address)), name);
      !s)
    return s.error();
  return value;
}

// The bounds of the allocation (or, for VMM, of the mapped physical
// allocation) that holds `address`.
Result<std::pair<uint64_t, uint64_t>> allocation_of(const cuda::DriverApi& api, uint64_t address) {
  CUdeviceptr base = 0;
  size_t size = 0;
  if (Status s =
          cuda::check(api.mem_get_address_range(&base, &size, address), "cuMemGetAddressRange");
      !s)
    return s.error();
  return std::pair<uint64_t, uint64_t>{base, base + size};
}

// A legacy handle for the cudaMalloc allocation [base, end).
Result<ExportedRange> export_legacy(uint64_t base, uint64_t end) {
  ExportedRange r;
  r.base = base;
  r.bytes = end - base;
  cudaIpcMemHandle_t h;
  if (Status s = cuda::check(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)),
                             "cudaIpcGetMemHandle");
      !s)
    return s.error();
  static_assert(sizeof(h) == 64);
  std::memcpy(r.ipc_handle.data(), &h, sizeof(h));
  return r;
}

// The VMM range [begin, end) (chunk-aligned), an fd per physical allocation.
Result<ExportedRange> export_vmm(const cuda::DriverApi& api, uint64_t begin, uint64_t end) {
  ExportedRange r;
  r.base = begin;
  r.bytes = end - begin;
  r.vmm = true;
  for (uint64_t at = begin; at < end;) {
    Result<std::pair<uint64_t, uint64_t>> chunk = allocation_of(api, at);
    if (!chunk) return chunk.error();
    CUmemGenericAllocationHandle handle = 0;
    if (Status s =
            cuda::check(api.mem_retain_allocation_handle(&handle, reinterpret_cast<void*>(at)),
                        "cuMemRetainAllocationHandle");
        !s)
      return s.error();
    int fd = -1;
    const CUresult exported = api.mem_export_to_shareable_handle(
        &fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    (void)api.mem_release(handle);  // the retain's reference
    if (Status s = cuda::check(exported, "cuMemExportToShareableHandle"); !s) return s.error();
    r.chunks.push_back(
        ExportedChunk{UniqueFd(fd), chunk->first - begin, chunk->second - chunk->first});
    at = chunk->second;
  }
  return r;
}

}  // namespace

namespace {

// A VMM pool exports an fd per chunk (an expandable-segments cache of a large
// model: about 3,000), all held until the registration is sent, and the
// usual soft limit on open files is 1,024: it is raised to the hard limit
// first, once per process, as kvrelay's workers do for the same fds.
void raise_open_file_limit() {
  static std::once_flag once;
  std::call_once(once, [] {
    rlimit files{};
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      (void)setrlimit(RLIMIT_NOFILE, &files);
    }
  });
}

}  // namespace

Result<ExportedPool> export_device_tensors(std::span<const uint64_t> addresses,
                                           std::span<const uint64_t> bytes) {
  Result<const cuda::DriverApi*> loaded = cuda::driver_api();
  if (!loaded) return loaded.error();
  const cuda::DriverApi& api = **loaded;
  ExportedPool out;
  out.tensors.resize(addresses.size());
  // What kind of memory each tensor is, and its (chunk-aligned) span.
  struct Span {
    size_t tensor;
    uint64_t begin;
    uint64_t end;
    bool vmm;
  };
  std::vector<Span> spans;
  for (size_t i = 0; i < addresses.size(); ++i) {
    const uint64_t a = addresses[i];
    const auto refuse = [&](const std::string& why) {
      return make_error(
          Errc::kInvalidArgument,
          fmt::format("tensor {} (device address {:#x}, {} bytes): {}", i, a, bytes[i], why));
    };
    if (a == 0 || bytes[i] == 0) return refuse("empty");
    Result<int> device = attribute<int>(api, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a,
                                        "cuPointerGetAttribute(DEVICE_ORDINAL)");
    if (!device) return refuse(fmt::format("not GPU memory: {}", device.error().message));
    if (out.device < 0) out.device = *device;
    if (*device != out.device)
      return refuse(
          fmt::format("it is on GPU {}, the pool's first tensor on GPU {}", *device, out.device));
    Result<int> legacy = attribute<int>(api, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, a,
                                        "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE)");
    Result<std::pair<uint64_t, uint64_t>> first = allocation_of(api, a);
    Result<std::pair<uint64_t, uint64_t>> last = allocation_of(api, a + bytes[i] - 1);
    if (!first || !last) return refuse((!first ? first : last).error().message);
    if (legacy && *legacy != 0) {
      if (last->first != first->first)
        return refuse("it runs past the end of its cudaMalloc allocation");
      spans.push_back(Span{i, first->first, first->second, false});
      continue;
    }
    Result<uint64_t> types = attribute<uint64_t>(api, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, a,
                                                 "cuPointerGetAttribute(ALLOWED_HANDLE_TYPES)");
    if (!types || (*types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0)
      return refuse(
          "its memory can be shared neither by a legacy IPC handle nor as a POSIX fd "
          "(a VMM allocation must be created with requestedHandleTypes including "
          "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)");
    spans.push_back(Span{i, first->first, last->second, true});
  }
  // Exported on the pool's own GPU, whatever device the calling thread had
  // current (an engine thread that never chose one would be on GPU 0), and
  // that thread's device put back afterwards.
  int caller_device = -1;
  (void)cudaGetDevice(&caller_device);
  (void)cudaGetLastError();
  if (Status s = cuda::use_device(out.device); !s) return s.error();
  if (Result<GpuUuid> uuid = gpu_uuid(out.device); !uuid)
    return uuid.error();
  else
    out.device_uuid = *uuid;
  if (std::any_of(spans.begin(), spans.end(), [](const Span& x) { return x.vmm; }))
    raise_open_file_limit();
  struct RestoreDevice {
    int device;
    ~RestoreDevice() {
      if (device >= 0) (void)cudaSetDevice(device);
    }
  } restore{caller_device};
  // Tensors of one allocation (legacy) or of touching chunks (VMM) share a
  // range: sort by address and merge.
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) {
    return x.begin != y.begin ? x.begin < y.begin : x.end > y.end;
  });
  for (size_t i = 0; i < spans.size();) {
    size_t j = i + 1;
    uint64_t end = spans[i].end;
    while (j < spans.size() && spans[j].vmm == spans[i].vmm &&
           (spans[i].vmm ? spans[j].begin <= end : spans[j].begin == spans[i].begin)) {
      end = std::max(end, spans[j].end);
      ++j;
    }
    Result<ExportedRange> range =
        spans[i].vmm ? export_vmm(api, spans[i].begin, end) : export_legacy(spans[i].begin, end);
    if (!range) return range.error();
    const auto index = static_cast<uint32_t>(out.ranges.size());
    for (size_t k = i; k < j; ++k)
      out.tensors[spans[k].tensor] =
          ExportedTensor{index, addresses[spans[k].tensor] - range->base};
    out.ranges.push_back(std::move(range).value());
    i = j;
  }
  return out;
}

}  // namespace kvrelay::kernels
