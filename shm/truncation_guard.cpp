#include "shm/truncation_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace kvrelay {

namespace {

constexpr int kMaxMappings = 256;

struct Mapping {
  std::atomic<uintptr_t> base{0};  // 0: free entry
  std::atomic<size_t> bytes{0};
  std::atomic<bool> truncated{false};
};

Mapping g_mappings[kMaxMappings];
struct sigaction g_previous {};
std::once_flag g_installed;
std::mutex g_registry_mu;  // registration only; the handler reads without it

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Mapping& m : g_mappings) {
    const uintptr_t base = m.base.load(std::memory_order_acquire);
    const size_t bytes = m.bytes.load(std::memory_order_acquire);
    if (base == 0 || addr < base || addr - base >= bytes) continue;
    // mmap is a plain system call here; the faulting access is retried on
    // return and finds a zero page.
    if (mmap(reinterpret_cast<void*>(base), bytes, PROT_READ | PROT_WRITE,
             MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) {
      m.truncated.store(true, std::memory_order_release);
      return;
    }
    break;
  }
  // Not ours: what was there before.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN &&
      g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  signal(SIGBUS, SIG_DFL);
  raise(SIGBUS);
}

void install() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

int TruncationGuard::watch(void* base, size_t bytes) {
  std::call_once(g_installed, install);
  std::lock_guard lock(g_registry_mu);
  for (int i = 0; i < kMaxMappings; ++i) {
    Mapping& m = g_mappings[i];
    if (m.base.load(std::memory_order_relaxed) != 0) continue;
    m.bytes.store(bytes, std::memory_order_relaxed);
    m.truncated.store(false, std::memory_order_relaxed);
    m.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);  // publish last
    return i;
  }
  return -1;
}

void TruncationGuard::release(int handle) {
  if (handle < 0 || handle >= kMaxMappings) return;
  std::lock_guard lock(g_registry_mu);
  g_mappings[handle].base.store(0, std::memory_order_release);
}

bool TruncationGuard::truncated(int handle) {
  return handle >= 0 && handle < kMaxMappings &&
         g_mappings[handle].truncated.load(std::memory_order_acquire);
}

}  // namespace kvrelay
