#include <algorithm>

#include "kernels/cuda/gather_kernel.h"
#include "kernels/cuda/runtime.h"

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
                             reinterpret_cast<const void*>(&gather_kernel<kSlicesPerLaunch>)})
    if (Status s = check(cudaFuncGetAttributes(&attributes, kernel), "loading the gather kernel");
        !s)
      return s;
  return {};
}

Status launch_gather(std::span<const CopySlice> slices, cudaStream_t stream, uint32_t max_blocks) {
  constexpr uint32_t kWarpsPerBlock = kGatherThreads / kWarpLanes;
  for (size_t first = 0; first < slices.size(); first += kSlicesPerLaunch) {
    const std::span<const CopySlice> part =
        slices.subspan(first, std::min<size_t>(kSlicesPerLaunch, slices.size() - first));
    const auto count = static_cast<uint32_t>(part.size());
    const uint32_t blocks =
        std::max<uint32_t>(1, std::min(max_blocks, (count + kWarpsPerBlock - 1) / kWarpsPerBlock));
    Status s = count <= 64    ? launch<64>(part, stream, blocks)
               : count <= 256 ? launch<256>(part, stream, blocks)
                              : launch<kSlicesPerLaunch>(part, stream, blocks);
    if (!s) return s;
  }
  return {};
}

}  // namespace kvrelay::kernels::cuda
