// The engine's side of sharing GPU memory: given the device addresses of a
// pool's tensors, what another process needs to map them. Used by the
// client library (Client::register_cuda_pool), so that an engine registers
// its KV cache by tensor pointers, whatever allocated it:
//
//   cudaMalloc memory (Paddle, PyTorch's default allocator): one legacy IPC
//     handle per allocation (cudaIpcGetMemHandle).
//   VMM memory (cuMemCreate; PyTorch's expandable segments): a POSIX fd per
//     physical allocation (cuMemExportToShareableHandle), several per range
//     when a tensor spans several; the allocation must have been created
//     exportable as POSIX fds.
//
// Tensors that share an allocation (a KV cache allocated in one piece) are
// exported once: the result is a list of ranges and, for each tensor, its
// range and offset.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "shm/result.h"
#include "shm/unique_fd.h"

namespace kvrelay::kernels {

struct ExportedChunk {
  UniqueFd fd;
  uint64_t offset;  // from the range's start
  uint64_t bytes;
};

struct ExportedRange {
  uint64_t base = 0;  // this process's device address of the range
  uint64_t bytes = 0;
  bool vmm = false;
  std::array<std::byte, 64> ipc_handle{};  // legacy
  std::vector<ExportedChunk> chunks;       // vmm, in order
};

struct ExportedTensor {
  uint32_t range;
  uint64_t offset;
};

struct ExportedPool {
  int device = -1;  // the GPU that holds every tensor (this process's ordinal)
  std::array<uint8_t, 16> device_uuid{};  // ...and its UUID (gpu_identity.h), in every process
  std::vector<ExportedRange> ranges;
  std::vector<ExportedTensor> tensors;  // in the order given
};

// Exports the memory of tensors at `addresses` of `bytes[i]` bytes each.
// kInvalidArgument naming the tensor when one is not GPU memory, lies on
// another GPU than the others, or is VMM memory not exportable as a POSIX
// fd; kUnsupported without CUDA.
Result<ExportedPool> export_device_tensors(std::span<const uint64_t> addresses,
                                           std::span<const uint64_t> bytes);

}  // namespace kvrelay::kernels
