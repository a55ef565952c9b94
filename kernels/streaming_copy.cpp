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
#include <immintrin.h>
#endif

namespace kvrelay::kernels {

#if KVRELAY_STREAMING_STORES

namespace {

// Up to the destination's first line boundary with memcpy, then whole lines
// with `copy_lines` (so that each write-combining buffer fills one line and
// goes out whole), then the rest with memcpy.
template <typename CopyLines>
void copy_by_lines(std::byte* dst, const std::byte* src, size_t bytes, CopyLines copy_lines) {
  const size_t head = std::min<size_t>((64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64, bytes);
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  bytes -= head;
  const size_t body = bytes & ~size_t{63};
  copy_lines(dst, src, body);
  std::memcpy(dst + body, src + body, bytes - body);
}

// `dst` 64-byte aligned, `bytes` a multiple of 64.
void stream_lines_sse2(std::byte* dst, const std::byte* src, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
}

// The same in two 32-byte stores a line: 12-15% faster than SSE2 for 16 KiB
// runs at scattered places on the project's AMD machines (fewer stores for
// the write-combining buffers to merge), docs/benchmarks.md.
__attribute__((target("avx2"))) void stream_lines_avx2(std::byte* dst, const std::byte* src,
                                                       size_t bytes) {
  for (size_t i = 0; i < bytes; i += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
  }
}

bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();  // in case the first copy runs before libgcc's own init
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}

}  // namespace

StreamingStores streaming_stores() {
  return cpu_has_avx2() ? StreamingStores::kAvx2 : StreamingStores::kSse2;
}

bool streaming_stores_available(StreamingStores kind) {
  return kind != StreamingStores::kAvx2 || cpu_has_avx2();
}

void streaming_copy_with(StreamingStores kind, std::byte* dst, const std::byte* src, size_t bytes) {
  switch (kind) {
    case StreamingStores::kNone: std::memcpy(dst, src, bytes); return;
    case StreamingStores::kSse2: copy_by_lines(dst, src, bytes, stream_lines_sse2); return;
    case StreamingStores::kAvx2: copy_by_lines(dst, src, bytes, stream_lines_avx2); return;
  }
}

void streaming_copy_fence() {
  _mm_sfence();
}

#else

StreamingStores streaming_stores() {
  return StreamingStores::kNone;
}

bool streaming_stores_available(StreamingStores kind) {
  return kind == StreamingStores::kNone;
}

void streaming_copy_with(StreamingStores, std::byte* dst, const std::byte* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

void streaming_copy_fence() {}

#endif

void streaming_copy(std::byte* dst, const std::byte* src, size_t bytes) {
  streaming_copy_with(streaming_stores(), dst, src, bytes);
}

const char* streaming_stores_name(StreamingStores kind) {
  switch (kind) {
    case StreamingStores::kNone: return "none (memcpy)";
    case StreamingStores::kSse2: return "sse2";
    case StreamingStores::kAvx2: return "avx2";
  }
  return "?";
}

}  // namespace kvrelay::kernels
