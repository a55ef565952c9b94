#include "kernels/streaming_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

// The sanitizers check memcpy's accesses, not these stores: they keep memcpy.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KVRELAY_UNDER_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVRELAY_UNDER_SANITIZER 1
#endif

#if defined(__x86_64__) && !defined(KVRELAY_UNDER_SANITIZER)
#define KVRELAY_STREAMING_STORES 1
#include <emmintrin.h>
#endif

namespace kvrelay::kernels {

#if KVRELAY_STREAMING_STORES

void streaming_copy(std::byte* dst, const std::byte* src, size_t bytes) {
  // Up to the destination's first 16-byte boundary with memcpy, then whole
  // 64-byte lines' worth of 16-byte streaming stores (SSE2: every x86-64
  // has it), then the rest with memcpy.
  const size_t head = std::min<size_t>((16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16, bytes);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  bytes -= head;
  const size_t body = bytes & ~size_t{63};
  for (size_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + body, src + body, bytes - body);
}

void streaming_copy_fence() {
  _mm_sfence();
}

#else

void streaming_copy(std::byte* dst, const std::byte* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

void streaming_copy_fence() {}

#endif

}  // namespace kvrelay::kernels
