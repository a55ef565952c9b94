// The sender's side of a grant: which granted key writes a given stretch of
// a destination tensor. A grant holds a key per run of the intent and tensor
// of the layer (control_wire.h); each key covers its run's blocks of its
// tensor, and a write is posted with the key whose run holds it whole.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "worker/copy_plan.h"

namespace kvrelay::worker::rdma {

// One tensor's keys, walked in the order its writes are made: to_byte_runs
// and to_head_runs make a tensor's byte runs run by run, in the intent's
// order (and a split write stays in its byte run), so each write lies in the
// run the previous one did or in the next. No sort and no lookup per write.
class GrantedRunKeys {
 public:
  // Run r's destination blocks, of `block_bytes` each, have key
  // rkeys[r * tensors + slot] (the grant's order); `rkeys` holds
  // runs.size() * tensors keys.
  GrantedRunKeys(std::span<const BlockRun> runs, std::span<const uint32_t> rkeys, uint32_t slot,
                 uint32_t tensors, uint64_t block_bytes)
      : runs_(runs), rkeys_(rkeys), slot_(slot), tensors_(tensors), block_bytes_(block_bytes) {}

  // The key of the current run or the next (which becomes current), if it
  // holds [offset, offset + length) whole; none otherwise.
  std::optional<uint32_t> next(uint64_t offset, uint64_t length);

 private:
  bool holds(size_t run, uint64_t offset, uint64_t length) const;

  std::span<const BlockRun> runs_;
  std::span<const uint32_t> rkeys_;
  uint32_t slot_;
  uint32_t tensors_;
  uint64_t block_bytes_;
  size_t current_ = 0;
};

}  // namespace kvrelay::worker::rdma
