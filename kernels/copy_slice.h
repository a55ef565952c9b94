// The body of the gather/scatter copy: one slice (a piece of a coalesced
// run, at most kMaxSliceBytes) copied by the `lanes` threads of one warp.
// It is one `__host__ __device__` function, so that the CUDA kernel
// (kernels/cuda/gather_kernel.cu) and the CPU tests run the very same code:
// the tests call it once per (warp, lane) and compare with memcpy.
//
// Why slices and not a warp per run: a request allocated contiguously on
// both sides coalesces into one run of megabytes, and one warp cannot move
// that at memory speed; cutting runs into 64 KiB slices gives every warp
// the same work whatever the coalescing did.
//
// Vector width: 16 bytes (uint4) when source, destination and length are
// all 16-byte aligned (KV blocks always are: block bytes are multiples of
// head_dim * dtype bytes, and pools start tensors on 4 KiB), else 8, 4, then
// 1. Each lane keeps kUnroll loads in flight before it stores, which is
// what lets a few SMs saturate HBM.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kernels/block_copy.h"

#if defined(__CUDACC__)
#define KVRELAY_HD __host__ __device__
#else
#define KVRELAY_HD
#endif

namespace kvrelay::kernels {

// A slice with absolute addresses (device pointers for the kernel).
struct CopySlice {
  uint64_t src;
  uint64_t dst;
  uint64_t bytes;
};

inline constexpr uint64_t kMaxSliceBytes = 64 * 1024;
inline constexpr uint32_t kWarpLanes = 32;
inline constexpr uint32_t kUnroll = 4;

namespace detail {

struct alignas(16) Vec16 {
  uint64_t lo;
  uint64_t hi;
};

// One vector of width W: a non-coherent (read-only path) load on the GPU.
template <typename V>
KVRELAY_HD inline V load_vector(const V* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
#endif
}

template <>
KVRELAY_HD inline Vec16 load_vector<Vec16>(const Vec16* p) {
#if defined(__CUDA_ARCH__)
  const ulonglong2 v = __ldg(reinterpret_cast<const ulonglong2*>(p));
  return Vec16{v.x, v.y};
#else
  Vec16 v;
  std::memcpy(&v, p, sizeof(Vec16));
  return v;
#endif
}

template <typename V>
KVRELAY_HD inline void store_vector(V* p, const V& v) {
#if defined(__CUDA_ARCH__)
  *p = v;
#else
  std::memcpy(p, &v, sizeof(V));
#endif
}

// Lane `lane` of `lanes` copies its share of `count` vectors of type V,
// kUnroll loads in flight per store batch.
template <typename V>
KVRELAY_HD inline void copy_vectors(const V* src, V* dst, uint64_t count, uint32_t lane,
                                    uint32_t lanes) {
  const uint64_t stride = uint64_t{lanes} * kUnroll;
  uint64_t i = lane;
  for (; i + uint64_t{lanes} * (kUnroll - 1) < count; i += stride) {
    V v[kUnroll];
    for (uint32_t u = 0; u < kUnroll; ++u)
      v[u] = load_vector(src + i + uint64_t{u} * lanes);
    for (uint32_t u = 0; u < kUnroll; ++u)
      store_vector(dst + i + uint64_t{u} * lanes, v[u]);
  }
  for (; i < count; i += lanes)
    store_vector(dst + i, load_vector(src + i));
}

}  // namespace detail

// Lane `lane` (0 <= lane < lanes) of one warp copies its share of `slice`.
// Every lane of the warp must call it for the slice to be copied whole.
KVRELAY_HD inline void copy_slice_lane(const CopySlice& slice, uint32_t lane, uint32_t lanes) {
  const uint64_t align = slice.src | slice.dst | slice.bytes;
  auto* src = reinterpret_cast<const unsigned char*>(slice.src);
  auto* dst = reinterpret_cast<unsigned char*>(slice.dst);
  if ((align & 15) == 0) {
    detail::copy_vectors(reinterpret_cast<const detail::Vec16*>(src),
                         reinterpret_cast<detail::Vec16*>(dst), slice.bytes / 16, lane, lanes);
  } else if ((align & 7) == 0) {
    detail::copy_vectors(reinterpret_cast<const uint64_t*>(src), reinterpret_cast<uint64_t*>(dst),
                         slice.bytes / 8, lane, lanes);
  } else if ((align & 3) == 0) {
    detail::copy_vectors(reinterpret_cast<const uint32_t*>(src), reinterpret_cast<uint32_t*>(dst),
                         slice.bytes / 4, lane, lanes);
  } else {
    detail::copy_vectors(src, dst, slice.bytes, lane, lanes);
  }
}

// Warp `warp` of `warps` copies every slice w, w + warps, ... (grid-stride),
// lane `lane` of it. The kernel is this loop; the CPU tests call it for
// every (warp, lane).
KVRELAY_HD inline void copy_slices_warp(const CopySlice* slices, uint32_t count, uint32_t warp,
                                        uint32_t warps, uint32_t lane) {
  for (uint32_t s = warp; s < count; s += warps)
    copy_slice_lane(slices[s], lane, kWarpLanes);
}

// Host side: cuts the runs of one tensor copy (offsets from src/dst bases)
// into slices of at most `max_slice` bytes, appended to `out`. `max_slice`
// is rounded down to a multiple of 16 so that the cuts keep alignment.
void append_slices(const std::byte* src, std::byte* dst, std::span<const CopyRun> runs,
                   std::vector<CopySlice>& out, uint64_t max_slice = kMaxSliceBytes);

}  // namespace kvrelay::kernels
