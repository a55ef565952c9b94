// GPU memory as a dma-buf, so that an RDMA NIC can register it and write
// into it directly (GPUDirect RDMA through ibv_reg_dmabuf_mr: no peer-memory
// kernel module needed, the upstream path since Linux 5.12). The rdma
// transport registers a pool in GPU memory this way (worker/rdma/
// registered_pool.h), and falls back to registering the device addresses
// themselves, which works where nvidia-peermem is loaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "shm/result.h"
#include "shm/unique_fd.h"

namespace kvrelay::kernels {

struct DmabufSpan {
  UniqueFd fd;          // a dma-buf of the GPU allocation that holds the address
  uint64_t offset = 0;  // of the address, from the dma-buf's start
  uint64_t bytes = 0;   // from the address to the end of what the dma-buf covers
};

// The dma-buf of the allocation that holds device address `address`
// (cuMemGetHandleForAddressRange). kUnsupported, saying why, without CUDA,
// on a driver or GPU without dma-buf support, or for memory the driver will
// not export.
Result<DmabufSpan> export_dmabuf(const std::byte* address);

// What the rdma transport calls: export_dmabuf, or the tests' stand-in.
using DmabufExporter = std::function<Result<DmabufSpan>(const std::byte* address)>;

}  // namespace kvrelay::kernels
