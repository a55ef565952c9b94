// Which GPU is which across processes. A CUDA ordinal means a GPU only in
// the process that counted it: under a per-rank CUDA_VISIBLE_DEVICES (the
// usual deployment) every engine rank's GPU is its GPU 0, and the worker,
// started with other devices visible, would copy on the wrong one. A GPU's
// UUID names it in every process, so a registration carries it and the
// worker finds its own ordinal for it (as LMCache and UCX learned to do).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "shm/result.h"

namespace kvrelay::kernels {

using GpuUuid = std::array<uint8_t, 16>;

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it.
std::string gpu_uuid_text(std::span<const uint8_t> uuid);

// This process's ordinal of the GPU `uuid` names, among `visible` (this
// process's GPUs by ordinal). An empty `uuid` (a client that predates it)
// takes `engine_ordinal` as it is. kNotFound, naming the GPU, the engine's
// ordinal and this process's CUDA_VISIBLE_DEVICES, when none matches;
// kInvalidArgument for a UUID that is not 16 bytes.
Result<int> resolve_gpu(std::span<const uint8_t> uuid, uint32_t engine_ordinal,
                        std::span<const GpuUuid> visible);

// The UUID of this process's GPU `device`; kUnsupported without CUDA.
Result<GpuUuid> gpu_uuid(int device);
// This process's GPUs' UUIDs, by ordinal; kUnsupported without CUDA.
Result<std::vector<GpuUuid>> visible_gpu_uuids();

}  // namespace kvrelay::kernels
