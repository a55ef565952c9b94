// The small enums of kvrelay's public face: what an instance does, what its
// KV cache is made of, and where a pool lives. Self-contained; kvrelay's own
// code uses these same definitions (the shared-memory layout stores them as
// uint32_t, and schemas/validate.cpp checks every value read back).
#pragma once

#include <cstdint>

namespace kvrelay {

enum class Role : uint32_t { kMixed = 0, kPrefill = 1, kDecode = 2 };
enum class CacheDtype : uint32_t { kBf16 = 0, kFp16 = 1, kUint8 = 2, kFp8 = 3 };

// A rank's pool tiers: the device tier is what transfers read and write (host
// memory in the host default), the host tier is where swaps evict to.
enum class PoolTier : uint32_t { kDevice = 0, kHost = 1 };
// Where a pool lives (a registered pool's PoolSpec::location; the pool
// directory stores the same numbers).
enum class PoolLocation : uint32_t {
  kHostSegment = 0,  // a host shared-memory pool segment, by name
  kCudaIpc = 1,      // GPU memory from cudaMalloc: a legacy IPC handle per allocation
  kCudaVmm = 2,      // GPU memory from the VMM API: POSIX fds (cuMemExportToShareableHandle)
  kHostFd = 3,       // host memory in memfds sealed with F_SEAL_SHRINK
};
// The tensors of one layer: K and V, then (fp8 with scales) their
// block-wise float32 scales. A K-only pool (an MLA latent cache) has no V
// and no V scale (kvrelay/pool_geometry.h).
enum class PoolTensor : uint32_t { kKey = 0, kValue = 1, kKeyScale = 2, kValueScale = 3 };

constexpr const char* tensor_name(PoolTensor t) {
  switch (t) {
    case PoolTensor::kKey: return "K";
    case PoolTensor::kValue: return "V";
    case PoolTensor::kKeyScale: return "K scale";
    case PoolTensor::kValueScale: return "V scale";
  }
  return "?";
}

const char* role_name(Role r);
const char* dtype_name(CacheDtype d);

// Bytes of one element; 0 for a value outside the enum.
constexpr uint32_t dtype_bytes(CacheDtype d) {
  switch (d) {
    case CacheDtype::kBf16:
    case CacheDtype::kFp16: return 2;
    case CacheDtype::kUint8:
    case CacheDtype::kFp8: return 1;
  }
  return 0;
}

}  // namespace kvrelay
