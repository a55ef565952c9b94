// A mapping of one rank's host-memory KV pool (Client::open_pool), to write
// or check KV bytes: the host default's device tier, or a host tier.
//
// Part of kvrelay's public face (self-contained). The mapping stays valid
// while the view lives, even after the instance shuts down (the segment is
// then unlinked, and freed when the last mapping goes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kvrelay/pool_geometry.h"
#include "kvrelay/result.h"
#include "kvrelay/types.h"

namespace kvrelay {

class PoolView {
 public:
  ~PoolView();
  PoolView(PoolView&&) noexcept;
  PoolView& operator=(PoolView&&) noexcept;

  const PoolGeometry& geometry() const;
  const std::string& segment_name() const;
  uint32_t rank() const;
  uint64_t bytes() const;

  // Base of a tensor; nullptr for a tensor the pool does not have.
  std::byte* tensor(uint32_t layer, PoolTensor t) const;
  // Address of one block; nullptr when layer, tensor or block is out of range.
  std::byte* block(uint32_t layer, PoolTensor t, uint32_t block_id) const;
  // kCorrupt naming the pool when another process truncated it under this
  // mapping (every byte read since is garbage), else ok.
  Status check_intact() const;

  struct Impl;
  explicit PoolView(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvrelay
