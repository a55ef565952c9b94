// The memory-window work of one receiving queue pair: the binds that make a
// grant's keys and the invalidations that take them back (rdma_receiver.h).
// The receiving side posts nothing else on its send queue, so this owns it:
// operations wait here in order and are posted as slots free, each one
// signaled, so that every completion frees its slot and the last operation
// of a job says that the whole job is done (a send queue completes in
// order).
//
// Not thread-safe: each session lives on its connection's strand.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "worker/rdma/fabric.h"

namespace kvrelay::worker::rdma {

class WindowWork {
 public:
  struct Bind {
    Window* window;
    const Registration* region;
    uint64_t address;
    uint64_t bytes;
  };

  explicit WindowWork(RcQueuePair& qp) : qp_(qp), slots_(qp.max_send_wr()) {}

  // Queues a job that binds each of `binds`, or invalidates each of `rkeys`;
  // `tag` is reported by complete() once its last operation completed. A job
  // of nothing is reported at the next complete().
  void bind(uint32_t tag, const std::vector<Bind>& binds);
  void invalidate(uint32_t tag, const std::vector<uint32_t>& rkeys);
  // Posts what waits, as far as the send queue has slots.
  Status post();
  // Takes `wc`, the queue pair's next send completion, and appends the tag
  // of the job it finished, if it did. An error: an operation failed (the
  // session is broken).
  Status complete(const WorkCompletion& wc, std::vector<uint32_t>& finished);
  // Jobs of nothing, reported without a completion.
  void take_empty(std::vector<uint32_t>& finished);

  size_t waiting() const { return waiting_.size(); }
  uint32_t in_flight() const { return in_flight_; }

 private:
  struct Op {
    uint32_t tag;
    bool last;  // of its job
    bool bind;
    Bind what;      // a bind's
    uint32_t rkey;  // an invalidation's
  };

  RcQueuePair& qp_;
  const uint32_t slots_;
  uint32_t in_flight_ = 0;
  uint64_t next_wr_id_ = 1;
  std::deque<Op> waiting_;
  std::deque<Op> posted_;  // in posting order: completions come in this order
  std::vector<uint32_t> empty_jobs_;
};

}  // namespace kvrelay::worker::rdma
