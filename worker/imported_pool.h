// A pool the engine allocated itself and registered by tensor table
// (PoolDescriptor locations cudaIpc, cudaVmm, hostFd): every allocation the
// table names is mapped here once, for as long as the registration lives,
// and each tensor is its allocation's base plus its offset. The same class
// maps a peer's pool for the ipc transport (from the peer worker's fd
// socket), so the engine's registration and a peer's mapping follow one set
// of rules.
//
//   cudaIpc  a legacy CUDA IPC handle per allocation
//   cudaVmm  a VMM POSIX fd per allocation (imported, then closable)
//   hostFd   a memfd per allocation, which must be sealed against
//            shrinking (F_SEAL_SHRINK): a pool nobody can truncate under
//            us needs no SIGBUS guard
//
// The descriptor must have passed messages::validate (every tensor inside
// its allocation, no overlaps); what the mappings reveal (an allocation
// smaller than claimed, an fd that is no memfd) is checked here.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/device_memory.h"
#include "schemas/kvrelay.capnp.h"
#include "shm/unique_fd.h"
#include "worker/local_pool.h"

namespace kvrelay::worker {

class ImportedPool final : public LocalPool {
 public:
  // Maps what `descriptor` names (fds: those passed under its ticket, by
  // fd_index) for copies on CUDA device `device` (GPU memory only); its
  // geometry must be `expected`.
  static Result<std::unique_ptr<ImportedPool>> open(schema::PoolDescriptor::Reader descriptor,
                                                    const PoolGeometry& expected,
                                                    std::span<const UniqueFd> fds, int device,
                                                    std::string name);
  ~ImportedPool() override;

  const PoolGeometry& geometry() const override { return geometry_; }
  const std::string& name() const override { return name_; }
  uint64_t bytes() const override { return bytes_; }
  kernels::MemoryKind memory_kind() const override { return kind_; }
  std::byte* tensor(uint32_t layer, PoolTensor t) const override;
  Status check_intact() const override { return {}; }  // sealed or GPU memory: nobody shrinks it
  bool truncated() const override { return false; }
  std::vector<std::span<std::byte>> host_memory() const override;
  int cuda_device() const override { return kind_ == kernels::MemoryKind::kCuda ? device_ : -1; }

 private:
  // One mapped allocation: host (mmap of a memfd) or GPU.
  struct HostMapping {
    std::byte* base = nullptr;
    uint64_t bytes = 0;
  };
  ImportedPool(PoolGeometry geometry, std::string name, kernels::MemoryKind kind, int device);

  PoolGeometry geometry_;
  std::string name_;
  kernels::MemoryKind kind_;
  int device_;
  uint64_t bytes_ = 0;
  std::vector<HostMapping> host_;                             // hostFd
  std::vector<kernels::ImportedDeviceMemory> device_memory_;  // cudaIpc, cudaVmm
  std::vector<std::byte*> tensors_;                           // [layer * per_layer + tensor]
};

// Whether a pool location is GPU memory.
bool is_gpu_location(schema::PoolDescriptor::Location location);
// "cuda-ipc", "cuda-vmm", "host-fd", "host-segment".
const char* location_name(schema::PoolDescriptor::Location location);

}  // namespace kvrelay::worker
