// A copy whose destination bypasses the cache (x86 non-temporal stores).
//
// A KV block copied on the host lands in a pool far larger than any cache
// and is read next by another process or a device, not by the core that
// wrote it. memcpy's ordinary stores first read every destination line they
// are about to overwrite (read-for-ownership) and fill the cache with lines
// nobody here will read; glibc switches to streaming stores only above a
// threshold set from the cache size the machine reports, which VMs report
// in the hundreds of MiB, so a layer's blocks never reach it. Streaming
// stores skip both: measured on the project's machines with the source just
// written (a layer the engine computed) and a cold destination, 1 MiB in 16
// KiB blocks took 47 us against memcpy's 92 (docs/benchmarks.md).
//
// Streaming stores are weakly ordered: whoever publishes the copy as done
// must call streaming_copy_fence() first (copy_runs_host does).
//
// The stores are AVX2's where the CPU has it (checked once, at the first
// copy), SSE2's otherwise (every x86-64 has it). Elsewhere than x86-64, and
// under ASan or TSan (which check memcpy but not these stores), it is memcpy.
#pragma once

#include <cstddef>

namespace kvrelay::kernels {

// Copies `bytes` from `src` to `dst` (not overlapping); any alignment.
void streaming_copy(std::byte* dst, const std::byte* src, size_t bytes);
// Orders every streaming store before it ahead of every store after it.
void streaming_copy_fence();

// The kinds of stores, for tests and benchmarks that try each.
enum class StreamingStores { kNone, kSse2, kAvx2 };
// What streaming_copy() uses in this process.
StreamingStores streaming_stores();
// Whether this build and CPU can run `kind` (kNone, plain memcpy, always).
bool streaming_stores_available(StreamingStores kind);
// streaming_copy() with the given stores; `kind` must be available.
void streaming_copy_with(StreamingStores kind, std::byte* dst, const std::byte* src, size_t bytes);
const char* streaming_stores_name(StreamingStores kind);

}  // namespace kvrelay::kernels
