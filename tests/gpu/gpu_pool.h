// GPU tests' engine memory: a rank's KV pool in GPU memory allocated the two
// ways engines do, and a host mirror of it (a PoolView) that the KV
// patterns (tools/sim/kv_pattern.h) fill and check:
//   kCudaMalloc  one cudaMalloc per layer holding its K and V (Paddle's and
//                PyTorch's default allocator): shared by legacy IPC handle
//   kVmm         cuMemCreate allocations of the device's granularity mapped
//                back to back (PyTorch's expandable segments), so that
//                tensors span several: shared by POSIX fds, chunk by chunk
// Also the one skip every GPU test starts with.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "client/views.h"
#include "gpu/gpu_required.h"
#include "kernels/copy_engine.h"
#include "kernels/cuda/runtime.h"
#include "kvrelay/pool_geometry.h"

namespace kvrelay::testing {

// The one skip every GPU test starts with: a skip where a GPU must be
// (gpu_required.h) is a failure.
#define KVRELAY_REQUIRE_GPU()                                                 \
  do {                                                                        \
    if (Status gpu_ = ::kvrelay::kernels::cuda_device_usable(0); !gpu_) {     \
      const std::string why_ = ::kvrelay::testing::with_cuda_versions(gpu_);  \
      const std::string& must_ = ::kvrelay::testing::gpu_required_because(); \
      if (!must_.empty()) FAIL() << "no usable GPU, but " << must_ << ": " << why_; \
      GTEST_SKIP() << "no usable GPU here: " << why_;                         \
    }                                                                         \
  } while (0)

#define KVRELAY_CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

class GpuPool {
 public:
  enum class Kind { kCudaMalloc, kVmm };

  GpuPool(const PoolGeometry& g, Kind kind, uint32_t rank) : geometry_(g), kind_(kind) {
    const uint32_t n = g.total_layers() * g.tensors_per_layer();
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (uint32_t t = 0; t < n; ++t) {
      offsets.push_back(offset);
      offset += align(bytes_of(t));
    }
    total_ = offset;
    if (kind == Kind::kCudaMalloc) {
      // One allocation per layer.
      for (uint32_t layer = 0; layer < g.total_layers(); ++layer) {
        uint64_t layer_bytes = 0;
        for (uint32_t t = 0; t < g.tensors_per_layer(); ++t)
          layer_bytes += align(bytes_of(layer * g.tensors_per_layer() + t));
        void* p = nullptr;
        if (cudaMalloc(&p, layer_bytes) != cudaSuccess) return;
        mallocs_.push_back(p);
        uint64_t at = 0;
        for (uint32_t t = 0; t < g.tensors_per_layer(); ++t) {
          device_.push_back(static_cast<std::byte*>(p) + at);
          at += align(bytes_of(layer * g.tensors_per_layer() + t));
        }
      }
    } else {
      const kernels::cuda::DriverApi& api = *kernels::cuda::driver_api().value();
      CUmemAllocationProp prop{};
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = 0;
      prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
      size_t granularity = 0;
      api.mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      vmm_bytes_ = (total_ + granularity - 1) / granularity * granularity;
      CUdeviceptr base = 0;
      if (api.mem_address_reserve(&base, vmm_bytes_, 0, 0, 0) != CUDA_SUCCESS) return;
      vmm_base_ = base;
      for (uint64_t at = 0; at < vmm_bytes_; at += granularity) {
        CUmemGenericAllocationHandle h = 0;
        if (api.mem_create(&h, granularity, &prop, 0) != CUDA_SUCCESS) return;
        api.mem_map(base + at, granularity, 0, h, 0);
        chunks_.push_back(h);
      }
      CUmemAccessDesc access{};
      access.location = prop.location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      api.mem_set_access(base, vmm_bytes_, &access, 1);
      granularity_ = granularity;
      for (uint32_t t = 0; t < n; ++t)
        device_.push_back(reinterpret_cast<std::byte*>(base + offsets[t]));
    }
    auto mirror = std::make_shared<std::vector<std::byte>>(total_);
    std::vector<std::byte*> host;
    for (uint32_t t = 0; t < n; ++t)
      host.push_back(mirror->data() + offsets[t]);
    host_ = std::make_unique<PoolView>(pool_view_of(g, host, mirror, "gpu-test-mirror", rank));
  }
  ~GpuPool() {
    for (void* p : mallocs_)
      (void)cudaFree(p);
    if (vmm_base_ != 0) {
      const kernels::cuda::DriverApi& api = *kernels::cuda::driver_api().value();
      (void)api.mem_unmap(vmm_base_, vmm_bytes_);
      for (CUmemGenericAllocationHandle h : chunks_)
        (void)api.mem_release(h);
      (void)api.mem_address_free(vmm_base_, vmm_bytes_);
    }
  }
  GpuPool(const GpuPool&) = delete;
  GpuPool& operator=(const GpuPool&) = delete;

  bool ok() const {
    return device_.size() == geometry_.total_layers() * geometry_.tensors_per_layer();
  }
  // Device addresses of every tensor, layer-major (register_cuda_pool's).
  std::vector<uint64_t> addresses() const {
    std::vector<uint64_t> out;
    for (std::byte* p : device_)
      out.push_back(reinterpret_cast<uint64_t>(p));
    return out;
  }
  std::byte* device_tensor(uint32_t t) const { return device_[t]; }
  uint64_t bytes_of(uint32_t t) const {
    const uint32_t per = geometry_.tensors_per_layer();
    return geometry_.tensor_bytes(t / per, static_cast<PoolTensor>(t % per));
  }
  const PoolView& host() const { return *host_; }
  // The mirror to the GPU, and back.
  void upload() const { copy(cudaMemcpyHostToDevice); }
  void download() const { copy(cudaMemcpyDeviceToHost); }
  size_t vmm_chunks() const { return chunks_.size(); }
  size_t vmm_granularity() const { return granularity_; }  // bytes per chunk

 private:
  static uint64_t align(uint64_t b) { return (b + 255) / 256 * 256; }
  void copy(cudaMemcpyKind kind) const {
    const uint32_t per = geometry_.tensors_per_layer();
    for (uint32_t t = 0; t < device_.size(); ++t) {
      std::byte* host = host_->tensor(t / per, static_cast<PoolTensor>(t % per));
      if (kind == cudaMemcpyHostToDevice)
        EXPECT_EQ(cudaMemcpy(device_[t], host, bytes_of(t), kind), cudaSuccess);
      else
        EXPECT_EQ(cudaMemcpy(host, device_[t], bytes_of(t), kind), cudaSuccess);
    }
  }

  PoolGeometry geometry_;
  Kind kind_;
  uint64_t total_ = 0;
  std::vector<void*> mallocs_;
  CUdeviceptr vmm_base_ = 0;
  uint64_t vmm_bytes_ = 0;
  size_t granularity_ = 0;
  std::vector<CUmemGenericAllocationHandle> chunks_;
  std::vector<std::byte*> device_;
  std::unique_ptr<PoolView> host_;
};

}  // namespace kvrelay::testing
