#include "shm/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>

namespace kvrelay {

namespace {

long futex_syscall(const void* word, int op, uint32_t val, const timespec* timeout, uint32_t val3) {
  return syscall(SYS_futex, word, op, val, timeout, nullptr, val3);
}

}  // namespace

FutexWait futex_wait(std::atomic<uint32_t>& word, uint32_t expected, Deadline deadline) {
  return futex_wait_word(&word, expected, deadline);
}

FutexWait futex_wait_word(const void* word, uint32_t expected, Deadline deadline) {
  // FUTEX_WAIT_BITSET takes an absolute timeout; without FUTEX_CLOCK_REALTIME
  // it is measured on CLOCK_MONOTONIC, the clock Deadline uses.
  timespec abs{};
  abs.tv_sec = static_cast<time_t>(deadline.ns() / 1'000'000'000ULL);
  abs.tv_nsec = static_cast<long>(deadline.ns() % 1'000'000'000ULL);
  for (;;) {
    if (deadline.passed()) return FutexWait::kTimedOut;
    const long rc = futex_syscall(word, FUTEX_WAIT_BITSET, expected, &abs, FUTEX_BITSET_MATCH_ANY);
    if (rc == 0) return FutexWait::kWoken;
    switch (errno) {
      case EAGAIN: return FutexWait::kValueChanged;
      case ETIMEDOUT: return FutexWait::kTimedOut;
      case EINTR: continue;
      default: return FutexWait::kWoken;  // EFAULT/EINVAL cannot happen for a mapped, aligned word
    }
  }
}

int futex_wake(std::atomic<uint32_t>& word, int count) {
  return futex_wake_word(&word, count);
}

int futex_wake_word(const void* word, int count) {
  const long rc = futex_syscall(word, FUTEX_WAKE, static_cast<uint32_t>(count), nullptr, 0);
  return rc < 0 ? 0 : static_cast<int>(rc);
}

int futex_wake_all(std::atomic<uint32_t>& word) {
  return futex_wake(word, INT_MAX);
}

}  // namespace kvrelay
