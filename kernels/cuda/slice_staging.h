// Device-memory copies of a batch's slice list, for gathers too large for
// one launch's parameters (kernels/cuda/gather_kernel.h).
//
// Why: a batch of more slices than one launch's parameters hold used to be
// cut into launches of kSlicesPerLaunch, one after the other on the stream,
// and each launch drained to its last warp before the next began. On an H200
// a layer of 16,384 scattered 16 KiB blocks moved at 577 GB/s on 16 SMs in
// such launches, and at 752 GB/s in one launch reading its slices from
// device memory (1261 against 1833 GB/s on all 132 SMs).
//
// Each upload copies the slices into page-locked host memory, queues their
// copy to the device on the stream ahead of the kernel, and keeps both
// buffers until the batch's ticket has completed: the copy engine reads the
// host buffer, and the kernel the device one, after the call returns.
// Buffers are reused, so a worker moving layer after layer allocates only
// while its largest batches are in flight the first time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/copy_engine.h"
#include "kernels/copy_slice.h"
#include "shm/result.h"

namespace kvrelay::kernels::cuda {

class SliceStaging {
 public:
  SliceStaging() = default;
  SliceStaging(const SliceStaging&) = delete;
  SliceStaging& operator=(const SliceStaging&) = delete;
  // The caller synchronizes the stream first: the buffers may still be read.
  ~SliceStaging();

  // The device address of a copy of `slices`, queued on `stream`; the
  // buffers stay busy until release_through(ticket) or later.
  Result<const CopySlice*> upload(std::span<const CopySlice> slices, cudaStream_t stream,
                                  CopyTicket ticket);

  // Every buffer of a batch up to `completed` is free again.
  void release_through(CopyTicket completed);

 private:
  struct Buffer {
    CopySlice* host = nullptr;    // page-locked
    CopySlice* device = nullptr;  // on the stream's device
    size_t capacity = 0;          // slices
    CopyTicket busy_until = 0;    // 0: free
  };
  Result<Buffer*> free_buffer(size_t slices);

  std::vector<Buffer> buffers_;
};

}  // namespace kvrelay::kernels::cuda
