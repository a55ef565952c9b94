// The decode side's expected requests (ExpectArrival): which destination
// blocks each declared request may write, which blocks of which layers and
// tensors have arrived, and when a request is complete. The tcp receiver
// asks it about every frame before reading the payload (admit), and tells it
// when the payload is in the pool (landed); the worker declares and
// withdraws requests and reports what take() returns.
//
// The rules for a frame (its request is named by FrameHeader::request_key):
//   - of a declared request: only into blocks that request declared;
//   - of a request that arrived or was withdrawn here within the last
//     minute: refused (a late or repeated write must not land in blocks the
//     engine now uses);
//   - of an undeclared request: into blocks no declared request holds (the
//     pool's shape is checked separately, for every frame).
// A declared request's frame that breaks a rule fails that request.
//
// Thread-safe: the network threads and the worker's thread call it.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "shm/clock.h"
#include "shm/pool_geometry.h"
#include "shm/result.h"
#include "shm/wait_event.h"
#include "worker/tcp/wire.h"

namespace kvrelay::worker::tcp {

struct ArrivalEvent {
  uint64_t handle;
  enum Kind { kArrived, kFailed, kWithdrawn } kind;
  uint64_t bytes;
  std::string message;
};

class Arrivals {
 public:
  // `doorbell` is rung when take() has something.
  Arrivals(const PoolGeometry& pool, WaitEvent* doorbell);

  // Declares request `id` (handle `handle`) with its destination blocks.
  // Refuses a block another declared request holds, or an id declared
  // already. An empty list arrives at once.
  Status expect(uint64_t handle, const std::string& id, const std::vector<uint32_t>& blocks);
  // Withdraws it (cancel, timeout): true when it was declared. Its event
  // (kWithdrawn) comes once no payload of it is being written any more.
  bool withdraw(uint64_t handle);

  // Before a frame's payload is read: ok (then landed() must follow), or
  // why the frame must not be written.
  Status admit(const FrameHeader& frame);
  // After an admitted frame's payload is in the pool.
  void landed(const FrameHeader& frame);
  // An admitted frame whose payload never finished (its connection closed):
  // it counts for nothing, and no longer holds up a withdrawal.
  void abandoned(const FrameHeader& frame);

  std::vector<ArrivalEvent> take();
  bool any() const;

 private:
  struct Expected {
    uint64_t handle;
    std::string id;
    std::vector<uint32_t> blocks;
    std::vector<uint64_t> arrived;  // bits: (layer * tensors + tensor) * blocks + index
    uint64_t missing;               // bits not yet set
    uint64_t bytes = 0;
    uint32_t writing = 0;  // admitted frames whose payload is being read
    bool withdrawn = false;
    std::string failure;  // why it failed (a frame broke a rule), once writes in progress end
  };
  // Block ranges of a frame: [first, last] (whole blocks, checked before).
  bool frame_blocks(const FrameHeader& f, uint32_t* first, uint32_t* last) const;
  void finish(uint64_t key, ArrivalEvent::Kind kind, const std::string& message);
  void remember_gone(uint64_t key, const std::string& id);
  void forget_old_gone();

  PoolGeometry pool_;
  WaitEvent* doorbell_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Expected> expected_;   // by request key
  std::unordered_map<uint64_t, uint64_t> by_handle_;  // handle -> request key
  std::vector<uint64_t> owner_;                       // block -> request key, 0: none
  std::vector<uint32_t> index_in_owner_;              // block -> its index in the owner's list
  struct Gone {
    uint64_t key;
    uint64_t at_ns;
  };
  std::deque<Gone> gone_;  // arrived or withdrawn, oldest first
  std::unordered_map<uint64_t, std::string> gone_ids_;
  std::vector<ArrivalEvent> events_;
};

}  // namespace kvrelay::worker::tcp
