// Which host pages this process has page-locked for a GPU, counted. CUDA
// registers a page once per process: registering it again, even for another
// word on it, fails with cudaErrorHostMemoryAlreadyRegistered. The 16 ranks'
// device-signal words share one page of the instance status, so a process
// that drives two ranks (a single-process multi-GPU engine, the C API, a
// test) must pin that page once and give every writer its address from that
// one registration. PinnedHostRange (host_pinning.h) goes through here.
//
// A range inside one already pinned shares it (counted); the last release
// unpins. A range that overlaps a pinned one without lying inside it, or
// that needs a device mapping the pinned one lacks, is refused naming both:
// CUDA could not register it either, and unpinning the other to widen it
// would pull the pages from under its users.
//
// The registering itself is injected (register_pages/unregister_pages), so
// the rules run, and are tested, without a GPU. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

#include "shm/result.h"

namespace kvrelay::kernels {

class PinRegistry {
 public:
  struct Pages {
    uintptr_t start = 0;  // page-aligned
    uintptr_t end = 0;    // page-aligned, exclusive
    bool mapped = false;  // with a device address
    int device = -1;      // the GPU whose context registered it (-1: the thread's)
    uint64_t device_base = 0;  // the device address of `start` (mapped only)
  };
  // Registers [start, end) (mapped: and returns its device address in
  // `device_base`), or says why not.
  using Register = std::function<Status(Pages&)>;
  using Unregister = std::function<void(const Pages&)>;

  PinRegistry(Register register_pages, Unregister unregister_pages)
      : register_(std::move(register_pages)), unregister_(std::move(unregister_pages)) {}

  // The process's registry, over CUDA (host_pinning.cpp).
  static PinRegistry& process();

  // Pins the pages of [start, end), or counts one more user of the pinned
  // range that holds them. Returns that range (whose start may be below
  // `start`).
  Result<Pages> pin(uintptr_t start, uintptr_t end, bool mapped, int device);
  // One user fewer of the range that starts at `start`; the last unpins it.
  void release(uintptr_t start);

  // Pinned ranges, and users over all of them (tests, logs).
  size_t ranges() const;
  size_t users() const;

 private:
  struct Entry {
    Pages pages;
    size_t users = 0;
  };
  Register register_;
  Unregister unregister_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Entry> pinned_;  // by start
};

}  // namespace kvrelay::kernels
