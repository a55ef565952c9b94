// The device-to-device gather/scatter kernel: a warp per slice
// (kernels/copy_slice.h holds its body), grid-stride over the slices, on at
// most a given number of thread blocks so that it leaves the other SMs to
// the model. CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <span>

#include "kernels/copy_engine.h"
#include "kernels/copy_slice.h"
#include "shm/result.h"

namespace kvrelay::kernels::cuda {

class SliceStaging;

// Threads per block (32 warps), and one block per SM of the budget. CUDA
// cannot pin blocks to SMs: the scheduler spreads blocks over idle SMs, so
// 16 SMs' worth of small blocks (8 of 256 threads each, as before) ran on
// about 128 SMs. A block always runs on one SM, so `max_sms` blocks of the
// largest size use at most `max_sms` SMs: the cap --copy-max-sms promises.
inline constexpr uint32_t kGatherThreads = 1024;
inline constexpr uint32_t kGatherBlocksPerSm = 1;

// Up to 1280 slices of 24 bytes travel as the kernel's parameter (up to
// 32 KiB of parameters since CUDA 12.1 on Volta and newer), so such a launch
// needs no staging buffer and no copy of its own. A larger batch goes in one
// launch that reads its slices from device memory (slice_staging.h): cut
// into launches of 1280, it ran 23% slower on 16 SMs of an H200, every
// launch draining to its last warp before the next began.
inline constexpr uint32_t kSlicesPerLaunch = 1280;

// Queues the copy of every slice on `stream`, in one launch of at most
// `max_blocks` thread blocks. A batch of more than kSlicesPerLaunch slices
// is listed in `staging`, busy until `ticket` (the batch's) completes.
Status launch_gather(std::span<const CopySlice> slices, cudaStream_t stream, uint32_t max_blocks,
                     SliceStaging& staging, CopyTicket ticket);

// Loads the kernel's module now (CUDA 12.2 and later load modules lazily, at
// the first launch): a first launch inside an engine's stream capture, or
// behind a full device, must not be where loading happens or fails.
Status load_gather_kernels();

}  // namespace kvrelay::kernels::cuda
