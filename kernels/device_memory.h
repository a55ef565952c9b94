// GPU memory another process allocated, mapped into this one: the two ways
// an engine shares its KV cache.
//
//   legacy IPC   cudaIpcGetMemHandle on cudaMalloc memory (what the original
//                and Paddle do): opened with cudaIpcOpenMemHandle.
//   VMM fd       cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR) on
//                cuMemCreate memory (PyTorch's expandable segments): the fd
//                arrives over the rank's fd socket, is imported, and mapped
//                into an address range reserved here.
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

#include "shm/result.h"

namespace kvrelay::kernels {

class ImportedDeviceMemory {
 public:
  static Result<ImportedDeviceMemory> open_ipc(int device, std::span<const std::byte> handle,
                                               uint64_t bytes);
  static Result<ImportedDeviceMemory> open_vmm(int device, int fd, uint64_t bytes);

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

  Kind kind_ = Kind::kNone;
  int device_ = 0;
  std::byte* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t vmm_handle_ = 0;  // CUmemGenericAllocationHandle
};

}  // namespace kvrelay::kernels
