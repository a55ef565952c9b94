// The sender's side of a grant: which granted key writes a given stretch of
// a destination tensor. A grant holds a key per run of the intent and tensor
// of the layer (control_wire.h); each key covers its run's blocks of its
// tensor, and a write is posted with the key whose window holds it whole.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "worker/copy_plan.h"

namespace kvrelay::worker::rdma {

// What one granted key writes: destination bytes [begin, end) of a tensor.
struct GrantWindow {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint32_t rkey = 0;
};

// The windows of the tensor at `slot` of `tensors` per layer, sorted: run
// r's destination blocks, of `block_bytes` each, with key
// rkeys[r * tensors + slot] (the grant's order). `rkeys` holds
// runs.size() * tensors keys.
void windows_of(std::span<const BlockRun> runs, std::span<const uint32_t> rkeys, uint32_t slot,
                uint32_t tensors, uint64_t block_bytes, std::vector<GrantWindow>& out);

// The key whose window holds [offset, offset + length) whole, if one does.
std::optional<uint32_t> key_for(std::span<const GrantWindow> windows, uint64_t offset,
                                uint64_t length);

}  // namespace kvrelay::worker::rdma
