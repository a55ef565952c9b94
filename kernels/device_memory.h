// GPU memory another process allocated, mapped into this one: the two ways
// an engine shares its KV cache.
//
//   legacy IPC   cudaIpcGetMemHandle on cudaMalloc memory (what the original
//                and Paddle do): opened with cudaIpcOpenMemHandle.
//   VMM fds      cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR) on
//                cuMemCreate memory (PyTorch's expandable segments): the
//                fds arrive over the rank's fd socket, are imported, and
//                mapped back to back into an address range reserved here, as
//                the engine had them (one tensor may span many 20 MiB
//                allocations).
//
// Either way the memory is reachable from `device` (the GPU this worker
// copies with): peer access is enabled when it lives on another GPU. The
// mapping is undone when the object goes, and with it this process's hold
// on the exporter's memory: a worker never keeps a dead or replaced peer's
// GPU memory alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "shm/result.h"

namespace kvrelay::kernels {

// One VMM allocation of a range: its fd, and where it is mapped in the range.
struct VmmPiece {
  int fd;
  uint64_t offset;
  uint64_t bytes;
};

class ImportedDeviceMemory {
 public:
  static Result<ImportedDeviceMemory> open_ipc(int device, std::span<const std::byte> handle,
                                               uint64_t bytes);
  // `pieces` cover [0, bytes) back to back.
  static Result<ImportedDeviceMemory> open_vmm(int device, std::span<const VmmPiece> pieces,
                                               uint64_t bytes);

  ImportedDeviceMemory() = default;
  ImportedDeviceMemory(ImportedDeviceMemory&& other) noexcept;
  ImportedDeviceMemory& operator=(ImportedDeviceMemory&& other) noexcept;
  ImportedDeviceMemory(const ImportedDeviceMemory&) = delete;
  ImportedDeviceMemory& operator=(const ImportedDeviceMemory&) = delete;
  ~ImportedDeviceMemory();

  std::byte* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }

 private:
  enum class Kind : uint8_t { kNone, kIpc, kVmm };
  void release();

  // [[maybe_unused]]: a build without CUDA (no_cuda.cpp) never reads them.
  [[maybe_unused]] Kind kind_ = Kind::kNone;
  [[maybe_unused]] int device_ = 0;
  std::byte* base_ = nullptr;
  uint64_t bytes_ = 0;
  struct Mapped {
    uint64_t handle;  // CUmemGenericAllocationHandle
    uint64_t offset;
    uint64_t bytes;
  };
  std::vector<Mapped> vmm_;  // imported and mapped, in order
  [[maybe_unused]] bool reserved_ = false;
};

}  // namespace kvrelay::kernels
