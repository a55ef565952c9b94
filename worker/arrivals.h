// The decode side's expected requests (ExpectArrival): which destination
// blocks each declared request may write, which blocks of which layers and
// tensors have arrived, and when a request is complete. Both ways in feed
// it: the tcp receiver asks it about every frame before reading the payload
// (admit) and tells it when the payload is in the pool (landed); the ipc
// receiver (ipc_receiver.h) replays what prefill workers on this host say they
// wrote. The worker declares and withdraws requests and reports what take()
// returns.
//
// The rules for a write (its request is named by LandedWrite::request_key):
//   - of a declared request: only into blocks that request declared;
//   - of a request that arrived or was withdrawn here within the last
//     minute: refused (a late or repeated write must not land in blocks the
//     engine now uses);
//   - of an undeclared request: into blocks no declared request holds (the
//     pool's shape is checked separately, for every write).
// A declared request's write that breaks a rule fails that request.
//
// A declaration may reach a rank after the sender's first writes (the decode
// engine declares, the prefill engine sends, and the two paths race): what
// an undeclared request wrote in the last minute is remembered, and counts
// once it is declared (or fails it, if it went outside its blocks).
//
// A declaration may name its sender (ExpectArrival.fromInstance): then only
// that instance's writes count, fail it or hold its blocks; another's are
// refused, or (admitted before the declaration) counted for nothing, and
// fail nothing. The request key itself may be keyed by a nonce only the two
// engines know (request_key.h).
//
// Thread-safe: the network threads and the worker's thread call it.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "instance/pool_geometry.h"
#include "shm/clock.h"
#include "shm/result.h"
#include "shm/wait_event.h"
#include "worker/request_key.h"

namespace kvrelay::worker {

// One tensor's bytes of one layer, written at `dst_offset` of that tensor:
// whole blocks, or (heterogeneous TP: several senders fill one block) a
// range of heads within one block. A block has arrived once every head of
// it has, from whichever writes.
struct LandedWrite {
  uint64_t request_key = 0;
  uint32_t layer = 0;
  uint32_t tensor = 0;  // PoolTensor
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
  // The writing instance: a connection's authenticated hello, or an ipc
  // writer's record. Must outlive the call.
  std::string_view sender;
  // When the writer saw it land, on this host's monotonic clock (an ipc
  // writer's stamp, unchecked); 0: not known (tcp, rdma). Timing only.
  uint64_t landed_ns = 0;
};

struct ArrivalEvent {
  uint64_t handle;
  enum Kind { kArrived, kFailed, kWithdrawn } kind;
  uint64_t bytes;
  std::string message;
  // kArrived: the latest landed_ns of the writes that counted (0: none had
  // one), for timing the tail; unchecked, as the stamps are.
  uint64_t last_landed_ns = 0;
};

class Arrivals {
 public:
  // `doorbell` is rung when take() has something.
  Arrivals(const PoolGeometry& pool, WaitEvent* doorbell);

  // Declares request `id` (handle `handle`) with its destination blocks,
  // from instance `from` (empty: any), named on the data plane by
  // request_key(id, nonce). Refuses a block another declared request holds,
  // or a request declared already. An empty list arrives at once.
  Status expect(uint64_t handle, const std::string& id, const std::vector<uint32_t>& blocks,
                const std::string& from = {}, uint64_t nonce = 0);
  // Withdraws it (cancel, timeout): true when it was declared. Its event
  // (kWithdrawn) comes once no payload of it is being written any more.
  [[nodiscard]] bool withdraw(uint64_t handle);

  // Before a write: ok (then landed() or abandoned() must follow), or why it
  // must not be written.
  Status admit(const LandedWrite& write);
  // After an admitted write's bytes are in the pool.
  void landed(const LandedWrite& write);
  // An admitted write that never finished (its connection closed, or the
  // writer refused it after all): it counts for nothing, and no longer holds
  // up a withdrawal.
  void abandoned(const LandedWrite& write);
  // Whether `handle` is a declared request still waiting here.
  bool expects(uint64_t handle) const;
  // Whether request `key` was withdrawn and waits for writes in progress: a
  // writer holding one abandons it (its peer cannot hold the withdrawal).
  bool withdrawing(uint64_t key) const;

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
    // Blocks of which only some heads arrived: bit (as in `arrived`) -> head mask.
    std::unordered_map<uint64_t, std::vector<uint64_t>> partial;
    std::string from;      // the one sender whose writes count; empty: any
    uint32_t writing = 0;  // admitted writes whose bytes are being written
    bool withdrawn = false;
    std::string failure;  // why it failed (a write broke a rule), once writes in progress end
    uint64_t last_landed_ns = 0;  // the latest LandedWrite::landed_ns that counted
  };
  // Blocks [first, last] of (layer, tensor), or heads [first_head, +heads)
  // of block `first` (heads 0: whole blocks).
  struct Span {
    uint32_t layer, tensor, first, last, first_head, heads;
  };
  using EarlyWrite = Span;
  // One sender's landed writes of one undeclared request.
  struct Early {
    std::string sender;
    uint64_t since_ns;
    std::vector<EarlyWrite> writes;
  };
  // Whether `w` is a write whose request `e` counts (its sender's).
  static bool counts_for(const Expected& e, const LandedWrite& w) {
    return e.from.empty() || e.from == w.sender;
  }
  void credit_early(uint64_t key, Expected& e);
  void undeclared_write_over(uint64_t key);
  void remember_early(uint64_t key, std::string_view sender, const Span& span);
  void drop_early(uint64_t key, const std::string& sender);
  void forget_old_early();
  void mark(Expected& e, const Span& span);
  // What a write covers; false when it is no whole blocks and no head range
  // within one block, or lies outside the pool (the shape check refuses it).
  bool write_span(const LandedWrite& w, Span* span) const;
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
  // Undeclared requests' landed writes, by key, one entry per sender.
  std::unordered_map<uint64_t, std::vector<Early>> early_;
  struct EarlyName {
    uint64_t key;
    std::string sender;
  };
  std::deque<EarlyName> early_order_;  // oldest first
  size_t early_entries_ = 0;
  std::unordered_map<uint64_t, uint32_t> undeclared_writing_;  // admitted, not yet landed, by key
};

}  // namespace kvrelay::worker
