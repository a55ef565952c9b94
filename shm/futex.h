// Futex waits on 32-bit words in shared memory.
//
// These are the shared (not FUTEX_PRIVATE_FLAG) variants: the kernel keys the
// wait on the physical page, so processes that map the same segment at
// different addresses wake each other.
#pragma once

#include <atomic>
#include <cstdint>

#include "shm/clock.h"

namespace kvrelay {

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain 32-bit");
static_assert(sizeof(std::atomic<uint32_t>) == 4);

enum class FutexWait {
  kWoken,         // a wake arrived (or a spurious wake-up: callers re-check their condition)
  kValueChanged,  // *word != expected when the kernel looked: no need to sleep
  kTimedOut,      // the deadline passed
};

// Sleeps while *word == expected, until woken or `deadline`. The timeout is
// absolute on CLOCK_MONOTONIC, so signals (EINTR) do not stretch it.
FutexWait futex_wait(std::atomic<uint32_t>& word, uint32_t expected, Deadline deadline);

// Wakes up to `count` waiters; returns how many were woken.
int futex_wake(std::atomic<uint32_t>& word, int count);
int futex_wake_all(std::atomic<uint32_t>& word);

// The same on a raw, 4-byte-aligned 32-bit word, for a futex word that is one
// half of a 64-bit atomic (see Barrier): the kernel reads it as 32 bits.
FutexWait futex_wait_word(const void* word, uint32_t expected, Deadline deadline);
int futex_wake_word(const void* word, int count);

// A hint to the CPU inside spin loops (PAUSE on x86).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace kvrelay
