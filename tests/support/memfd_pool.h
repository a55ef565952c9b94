// An engine's pool in memfds, the CPU stand-in for GPU memory shared by file
// descriptor (a CUDA VMM allocation exports a POSIX fd the same way): the
// pool's tensors, `per_memfd` of them back to back in each memfd (sealed
// against shrinking, as kvrelay requires), each filled with a pattern that
// names its layer, tensor and byte.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kvrelay/pool_geometry.h"
#include "shm/unique_fd.h"

namespace kvrelay::testing {

class MemfdPool {
 public:
  MemfdPool(const PoolGeometry& g, uint32_t per_memfd, bool seal = true)
      : geometry_(g), per_memfd_(per_memfd) {
    const uint32_t tensors = g.total_layers() * g.tensors_per_layer();
    for (uint32_t i = 0; i < tensors; i += per_memfd) {
      uint64_t bytes = 0;
      for (uint32_t t = i; t < i + per_memfd && t < tensors; ++t)
        bytes += tensor_bytes(t);
      UniqueFd fd(memfd_create("kvrelay-test-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING));
      if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) std::abort();
      if (seal && fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK) != 0) std::abort();
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
      if (p == MAP_FAILED) std::abort();
      memories_.push_back(Memory{std::move(fd), static_cast<std::byte*>(p), bytes});
    }
    for (uint32_t t = 0; t < tensors; ++t) {
      std::byte* base = tensor(t);
      for (uint64_t b = 0; b < tensor_bytes(t); ++b)
        base[b] = pattern(t, b);
    }
  }
  ~MemfdPool() {
    for (Memory& m : memories_)
      munmap(m.base, m.bytes);
  }
  MemfdPool(const MemfdPool&) = delete;
  MemfdPool& operator=(const MemfdPool&) = delete;

  // The byte `b` of tensor `t` (layer-major index) holds at creation.
  static std::byte pattern(uint32_t t, uint64_t b) {
    return static_cast<std::byte>((t * 131 + b * 7 + (b >> 8)) & 0xff);
  }

  uint64_t tensor_bytes(uint32_t t) const {
    const uint32_t per_layer = geometry_.tensors_per_layer();
    return geometry_.tensor_bytes(t / per_layer, static_cast<PoolTensor>(t % per_layer));
  }
  uint32_t memory_of(uint32_t t) const { return t / per_memfd_; }
  uint64_t offset_of(uint32_t t) const {
    uint64_t offset = 0;
    for (uint32_t i = memory_of(t) * per_memfd_; i < t; ++i)
      offset += tensor_bytes(i);
    return offset;
  }
  std::byte* tensor(uint32_t t) const { return memories_[memory_of(t)].base + offset_of(t); }
  size_t memories() const { return memories_.size(); }
  uint64_t memory_bytes(size_t i) const { return memories_[i].bytes; }
  std::vector<int> fds() const {
    std::vector<int> out;
    for (const Memory& m : memories_)
      out.push_back(m.fd.get());
    return out;
  }
  const PoolGeometry& geometry() const { return geometry_; }

 private:
  struct Memory {
    UniqueFd fd;
    std::byte* base;
    uint64_t bytes;
  };
  PoolGeometry geometry_;
  uint32_t per_memfd_;
  std::vector<Memory> memories_;
};

}  // namespace kvrelay::testing
