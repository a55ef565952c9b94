#include "support/allocation_counter.h"

#include <execinfo.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<bool> g_counting{false};
std::atomic<uint64_t> g_allocations{0};
// KVRELAY_ALLOC_TRACE=1: each counted allocation prints its stack to stderr
// (to find what allocated; addr2line or the symbols name the caller).
const bool g_trace = std::getenv("KVRELAY_ALLOC_TRACE") != nullptr;
thread_local bool t_tracing = false;

void note_allocation() {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (!g_trace || t_tracing) return;
  t_tracing = true;
  void* frames[24];
  const int n = backtrace(frames, 24);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  (void)!write(STDERR_FILENO, "--\n", 3);
  t_tracing = false;
}

void* counted(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) note_allocation();
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* counted_aligned(std::size_t n, std::align_val_t a) {
  if (g_counting.load(std::memory_order_relaxed)) note_allocation();
  const auto align = static_cast<std::size_t>(a);
  void* p = std::aligned_alloc(align, (n + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

namespace kvrelay::testing {

void start_counting_allocations() {
  g_allocations.store(0);
  g_counting.store(true);
}

uint64_t stop_counting_allocations() {
  g_counting.store(false);
  return g_allocations.load();
}

}  // namespace kvrelay::testing

void* operator new(std::size_t n) { return counted(n); }
void* operator new[](std::size_t n) { return counted(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new(std::size_t n, std::align_val_t a) { return counted_aligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_aligned(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
