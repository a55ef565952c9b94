// The GPU UUIDs of this process (kernels/gpu_identity.h), from the CUDA
// runtime's device properties.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cstring>

#include "kernels/cuda/runtime.h"
#include "kernels/gpu_identity.h"

namespace kvrelay::kernels {

Result<GpuUuid> gpu_uuid(int device) {
  if (Status s = cuda::any_device(); !s) return s.error();
  cudaDeviceProp properties{};
  if (Status s = cuda::check(cudaGetDeviceProperties(&properties, device),
                             fmt::format("cudaGetDeviceProperties({})", device));
      !s)
    return s.error();
  GpuUuid uuid{};
  static_assert(sizeof(properties.uuid.bytes) == sizeof(uuid));
  std::memcpy(uuid.data(), properties.uuid.bytes, uuid.size());
  return uuid;
}

Result<std::vector<GpuUuid>> visible_gpu_uuids() {
  if (Status s = cuda::any_device(); !s) return s.error();
  int count = 0;
  if (Status s = cuda::check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !s)
    return s.error();
  std::vector<GpuUuid> out;
  for (int d = 0; d < count; ++d) {
    Result<GpuUuid> uuid = gpu_uuid(d);
    if (!uuid) return uuid.error();
    out.push_back(*uuid);
  }
  return out;
}

}  // namespace kvrelay::kernels
