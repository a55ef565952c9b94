#include "kernels/cuda/slice_staging.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "kernels/cuda/runtime.h"

namespace kvrelay::kernels::cuda {

SliceStaging::~SliceStaging() {
  for (Buffer& b : buffers_) {
    (void)cudaFreeHost(b.host);
    (void)cudaFree(b.device);
  }
}

Result<SliceStaging::Buffer*> SliceStaging::free_buffer(size_t slices) {
  Buffer* best = nullptr;
  for (Buffer& b : buffers_)
    if (b.busy_until == 0 && b.capacity >= slices && (best == nullptr || b.capacity < best->capacity))
      best = &b;
  if (best != nullptr) return best;
  // A power of two of at least 4,096 slices (96 KiB): a few sizes serve
  // every batch, so buffers are rarely added.
  Buffer fresh;
  fresh.capacity = std::bit_ceil(std::max<size_t>(slices, 4096));
  const size_t bytes = fresh.capacity * sizeof(CopySlice);
  if (Status s = check(cudaMallocHost(reinterpret_cast<void**>(&fresh.host), bytes),
                       "cudaMallocHost of a slice list");
      !s)
    return s.error();
  if (Status s = check(cudaMalloc(reinterpret_cast<void**>(&fresh.device), bytes),
                       "cudaMalloc of a slice list");
      !s) {
    (void)cudaFreeHost(fresh.host);
    return s.error();
  }
  buffers_.push_back(fresh);
  return &buffers_.back();
}

Result<const CopySlice*> SliceStaging::upload(std::span<const CopySlice> slices,
                                              cudaStream_t stream, CopyTicket ticket) {
  Result<Buffer*> b = free_buffer(slices.size());
  if (!b) return b.error();
  Buffer& buffer = **b;
  std::memcpy(buffer.host, slices.data(), slices.size_bytes());
  if (Status s = check(cudaMemcpyAsync(buffer.device, buffer.host, slices.size_bytes(),
                                       cudaMemcpyHostToDevice, stream),
                       "queuing a slice list's copy");
      !s)
    return s.error();
  buffer.busy_until = ticket;
  return buffer.device;
}

void SliceStaging::release_through(CopyTicket completed) {
  for (Buffer& b : buffers_)
    if (b.busy_until != 0 && b.busy_until <= completed) b.busy_until = 0;
}

}  // namespace kvrelay::kernels::cuda
