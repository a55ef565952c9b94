#include "kernels/cuda/runtime.h"

#include <fmt/format.h>

#include <mutex>

namespace kvrelay::kernels::cuda {

Status check(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return {};
  return make_error(Errc::kSystem, fmt::format("{}: {} ({})", what, cudaGetErrorString(err),
                                               cudaGetErrorName(err)));
}

Status check(CUresult err, std::string_view what) {
  if (err == CUDA_SUCCESS) return {};
  const char* name = nullptr;
  const char* text = nullptr;
  if (Result<const DriverApi*> api = driver_api(); api) {
    (*api)->get_error_name(err, &name);
    (*api)->get_error_string(err, &text);
  }
  return make_error(Errc::kSystem,
                    fmt::format("{}: {} ({})", what, text != nullptr ? text : "CUDA driver error",
                                name != nullptr ? name : fmt::format("CUresult {}", int{err})));
}

Status any_device() {
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    // The usual answers on a machine without a GPU: no driver at all
    // (cudaErrorInsufficientDriver) or no device (cudaErrorNoDevice).
    // The versions say which side to upgrade (a CUDA 13 runtime needs an
    // R580 or newer driver; "driver supports 0.0": no driver loaded).
    int runtime = 0, driver = 0;
    (void)cudaRuntimeGetVersion(&runtime);
    (void)cudaDriverGetVersion(&driver);
    return make_error(Errc::kUnsupported,
                      fmt::format("CUDA is not usable on this machine: {} ({}; CUDA runtime "
                                  "{}.{}, driver supports {}.{})",
                                  cudaGetErrorString(err), cudaGetErrorName(err), runtime / 1000,
                                  runtime % 1000 / 10, driver / 1000, driver % 1000 / 10));
  }
  if (count == 0) return make_error(Errc::kUnsupported, "CUDA sees no GPU on this machine");
  return {};
}

Status use_device(int device) {
  if (Status s = any_device(); !s) return s;
  int count = 0;
  (void)cudaGetDeviceCount(&count);
  if (device < 0 || device >= count)
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("CUDA device {} does not exist: this machine has {}", device, count));
  return check(cudaSetDevice(device), fmt::format("cudaSetDevice({})", device));
}

namespace {

template <class Fn>
bool resolve(const char* symbol, Fn& out, std::string& missing) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  // 12000: the ABI of each entry point as CUDA 12.0 defined it (the
  // decltype()s in runtime.h are those of the _v2 symbols it selects).
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    missing += fmt::format("{}{}", missing.empty() ? "" : ", ", symbol);
    return false;
  }
  out = reinterpret_cast<Fn>(fn);
  return true;
}

struct Loaded {
  DriverApi api{};
  Status status;
};

Loaded load() {
  Loaded l;
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    l.status =
        make_error(Errc::kUnsupported, fmt::format("the CUDA driver is not usable: {} ({})",
                                                   cudaGetErrorString(err), cudaGetErrorName(err)));
    return l;
  }
  std::string missing;
  DriverApi& a = l.api;
  resolve("cuMemImportFromShareableHandle", a.mem_import_from_shareable_handle, missing);
  resolve("cuMemExportToShareableHandle", a.mem_export_to_shareable_handle, missing);
  resolve("cuMemRetainAllocationHandle", a.mem_retain_allocation_handle, missing);
  resolve("cuMemGetAllocationPropertiesFromHandle", a.mem_get_allocation_properties_from_handle,
          missing);
  resolve("cuMemAddressReserve", a.mem_address_reserve, missing);
  resolve("cuMemAddressFree", a.mem_address_free, missing);
  resolve("cuMemMap", a.mem_map, missing);
  resolve("cuMemUnmap", a.mem_unmap, missing);
  resolve("cuMemSetAccess", a.mem_set_access, missing);
  resolve("cuMemRelease", a.mem_release, missing);
  resolve("cuMemGetAddressRange", a.mem_get_address_range, missing);
  resolve("cuPointerGetAttribute", a.pointer_get_attribute, missing);
  resolve("cuStreamWaitValue64", a.stream_wait_value_64, missing);
  resolve("cuStreamWriteValue64", a.stream_write_value_64, missing);
  resolve("cuMemCreate", a.mem_create, missing);
  resolve("cuMemGetAllocationGranularity", a.mem_get_allocation_granularity, missing);
  resolve("cuGetErrorName", a.get_error_name, missing);
  resolve("cuGetErrorString", a.get_error_string, missing);
  std::string optional;  // the transport says why when it is missing
  resolve("cuMemGetHandleForAddressRange", a.mem_get_handle_for_address_range, optional);
  if (!missing.empty())
    l.status = make_error(Errc::kUnsupported,
                          fmt::format("the CUDA driver lacks {} (a driver for CUDA 12.0 or "
                                      "newer is needed)",
                                      missing));
  return l;
}

}  // namespace

Result<const DriverApi*> driver_api() {
  static const Loaded loaded = load();
  if (!loaded.status) return loaded.status.error();
  return &loaded.api;
}

}  // namespace kvrelay::kernels::cuda
