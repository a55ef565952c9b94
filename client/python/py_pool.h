// kvrelay.Pool: one rank's host-memory KV pool mapped into this process, and
// its blocks as writable memoryviews (np.frombuffer(view, dtype) for arrays).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "kvrelay/pool_view.h"

namespace kvrelay::python {

class PyPool {
 public:
  explicit PyPool(std::unique_ptr<PoolView> pool) : pool_(std::move(pool)) {}

  const PoolGeometry& geometry() const { return pool_->geometry(); }
  const std::string& name() const { return pool_->segment_name(); }
  // A memoryview of one block of one tensor; the view keeps the mapping alive.
  pybind11::memoryview block(uint32_t layer, pybind11::handle tensor, uint32_t block_id) const;
  // A memoryview of a whole tensor of one layer, [num_blocks, kv_heads,
  // block_size, head_dim] (or the scales' shape): an engine's KV cache seen
  // in place (torch.frombuffer(view, dtype=...).view(...)), without a copy.
  pybind11::memoryview tensor(uint32_t layer, pybind11::handle tensor) const;
  // Bytes of one block of `tensor`.
  uint64_t block_bytes(pybind11::handle tensor) const;

 private:
  PoolTensor to_tensor(pybind11::handle tensor) const;
  std::shared_ptr<PoolView> pool_;
};

void define_pool(pybind11::module_& m);

}  // namespace kvrelay::python
