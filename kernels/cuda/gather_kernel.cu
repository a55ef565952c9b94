#include <algorithm>

#include "kernels/cuda/gather_kernel.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/slice_staging.h"

namespace kvrelay::kernels::cuda {

namespace {

template <uint32_t N>
struct SliceBatch {
  uint32_t count;
  uint32_t reserved;
  CopySlice slices[N];
};
static_assert(sizeof(SliceBatch<kSlicesPerLaunch>) <= 32764,
              "a kernel's parameters are at most 32764 bytes");

// __grid_constant__: the slices are read in place from the parameter space,
// never copied to each thread's local memory.
template <uint32_t N>
__global__ void __launch_bounds__(kGatherThreads)
    gather_kernel(const __grid_constant__ SliceBatch<N> batch) {
  const uint32_t thread = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t warps = gridDim.x * blockDim.x / kWarpLanes;
  copy_slices_warp(batch.slices, batch.count, thread / kWarpLanes, warps, thread % kWarpLanes);
}

// The same over a slice list in device memory (slice_staging.h): one launch
// for a batch of any size.
__global__ void __launch_bounds__(kGatherThreads)
    gather_kernel_from_memory(const CopySlice* slices, uint32_t count) {
  const uint32_t thread = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t warps = gridDim.x * blockDim.x / kWarpLanes;
  copy_slices_warp(slices, count, thread / kWarpLanes, warps, thread % kWarpLanes);
}

// One launch of `slices` (at most N) with a parameter block of N slices:
// the parameters are copied at every launch, so a few slices travel in a
// small block.
template <uint32_t N>
Status launch(std::span<const CopySlice> slices, cudaStream_t stream, uint32_t blocks) {
  // Large: kept off the (small) stack of the calling thread.
  static thread_local SliceBatch<N> batch;
  batch.count = static_cast<uint32_t>(slices.size());
  std::copy(slices.begin(), slices.end(), batch.slices);
  gather_kernel<N><<<blocks, kGatherThreads, 0, stream>>>(batch);
  return check(cudaGetLastError(), "launching the gather kernel");
}

}  // namespace

Status load_gather_kernels() {
  cudaFuncAttributes attributes{};
  for (const void* kernel : {reinterpret_cast<const void*>(&gather_kernel<64>),
                             reinterpret_cast<const void*>(&gather_kernel<256>),
                             reinterpret_cast<const void*>(&gather_kernel<kSlicesPerLaunch>),
                             reinterpret_cast<const void*>(&gather_kernel_from_memory)})
    if (Status s = check(cudaFuncGetAttributes(&attributes, kernel), "loading the gather kernel");
        !s)
      return s;
  return {};
}

Status launch_gather(std::span<const CopySlice> slices, cudaStream_t stream, uint32_t max_blocks,
                     SliceStaging& staging, CopyTicket ticket) {
  constexpr uint32_t kWarpsPerBlock = kGatherThreads / kWarpLanes;
  const auto blocks_for = [&](size_t count) {
    return static_cast<uint32_t>(std::max<size_t>(
        1, std::min<size_t>(max_blocks, (count + kWarpsPerBlock - 1) / kWarpsPerBlock)));
  };
  if (slices.empty()) return {};
  if (slices.size() <= kSlicesPerLaunch) {
    const auto count = static_cast<uint32_t>(slices.size());
    return count <= 64    ? launch<64>(slices, stream, blocks_for(count))
           : count <= 256 ? launch<256>(slices, stream, blocks_for(count))
                          : launch<kSlicesPerLaunch>(slices, stream, blocks_for(count));
  }
  Result<const CopySlice*> listed = staging.upload(slices, stream, ticket);
  if (!listed) return listed.error();
  // A count per launch that fits the kernel's 32-bit one (a 4 GiB run is
  // 65,536 slices: one launch in practice).
  constexpr size_t kMaxPerLaunch = size_t{1} << 30;
  for (size_t first = 0; first < slices.size(); first += kMaxPerLaunch) {
    const size_t count = std::min(kMaxPerLaunch, slices.size() - first);
    gather_kernel_from_memory<<<blocks_for(count), kGatherThreads, 0, stream>>>(
        *listed + first, static_cast<uint32_t>(count));
    if (Status s = check(cudaGetLastError(), "launching the gather kernel"); !s) return s;
  }
  return {};
}

}  // namespace kvrelay::kernels::cuda
