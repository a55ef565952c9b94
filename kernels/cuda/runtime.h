// The CUDA seam's plumbing (CUDA builds only): errors as Status, and the
// driver API resolved at run time.
//
// Everything links the static CUDA runtime, which loads libcuda.so.1 itself
// on first use and answers "no driver" / "no device" when there is none, so
// one build runs on machines with and without a GPU. The driver API (VMM
// import/export, stream memory operations) is never linked: its entry
// points come from cudaGetDriverEntryPointByVersion, once per process.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string_view>

#include "shm/result.h"

namespace kvrelay::kernels::cuda {

// Ok, or kSystem: "<what>: <CUDA's name and text for err>".
Status check(cudaError_t err, std::string_view what);
Status check(CUresult err, std::string_view what);

// Ok when device `device` exists and this process can use it; the error
// says why not (no driver, no device, out of range), for a person to act on.
Status use_device(int device);
// Ok when this process sees at least one GPU; else kUnsupported saying why.
Status any_device();

// The driver entry points kvrelay uses. Resolved on the first call; an
// error (kUnsupported) when the driver is missing or too old for one of them.
struct DriverApi {
  decltype(&::cuMemImportFromShareableHandle) mem_import_from_shareable_handle;
  decltype(&::cuMemExportToShareableHandle) mem_export_to_shareable_handle;
  decltype(&::cuMemRetainAllocationHandle) mem_retain_allocation_handle;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) mem_get_allocation_properties_from_handle;
  decltype(&::cuMemAddressReserve) mem_address_reserve;
  decltype(&::cuMemAddressFree) mem_address_free;
  decltype(&::cuMemMap) mem_map;
  decltype(&::cuMemUnmap) mem_unmap;
  decltype(&::cuMemSetAccess) mem_set_access;
  decltype(&::cuMemRelease) mem_release;
  decltype(&::cuMemGetAddressRange) mem_get_address_range;
  // Optional (null on a driver without it): dma-bufs for GPUDirect RDMA.
  decltype(&::cuMemGetHandleForAddressRange) mem_get_handle_for_address_range;
  decltype(&::cuPointerGetAttribute) pointer_get_attribute;
  decltype(&::cuStreamWaitValue64) stream_wait_value_64;
  decltype(&::cuStreamWriteValue64) stream_write_value_64;
  decltype(&::cuMemCreate) mem_create;
  decltype(&::cuMemGetAllocationGranularity) mem_get_allocation_granularity;
  decltype(&::cuGetErrorName) get_error_name;
  decltype(&::cuGetErrorString) get_error_string;
};
Result<const DriverApi*> driver_api();

}  // namespace kvrelay::kernels::cuda
