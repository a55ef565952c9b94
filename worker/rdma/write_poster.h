// The rdma transport's posting logic: turns each layer transfer (one RDMA
// WRITE per coalesced run of each tensor, the last a WRITE_WITH_IMM) into
// posted chains on a peer rank's queue pairs, and turns their completions
// back into transfer completions.
//
//   - A transfer goes whole to one queue pair, round robin over them or the
//     one it names: RC ordering then makes its last write's completion mean
//     every one of its writes is done.
//   - Chains hold up to 32 writes. Every `signal_every`-th write is
//     signaled, and so is the last of every chain and of every transfer; a
//     signaled completion frees the send-queue slots of every write before
//     it (completions come in order).
//   - A send queue that fills takes the rest of a chain later, from the
//     first write it refused (ENOMEM from bad_wr, in verbs).
//   - An error completion puts the queue pair in the error state: the
//     transfers with writes on it fail, naming the queue pair and the
//     status; those not started move to a queue pair that still works (or
//     fail when none does), unless they name theirs (their keys serve it
//     alone). replace() swaps in a fresh queue pair.
//
// Not thread-safe: the worker's thread owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "worker/rdma/queue_pair.h"

namespace kvrelay::worker::rdma {

struct LayerWrite {
  uint64_t transfer = 0;  // the caller's id, handed back with the completion
  // In order; wr_id, signaled and immediate are the poster's to set.
  std::vector<WriteRequest> writes;
  uint32_t immediate = 0;  // carried by the last write
  // The queue pair it must go on (the receiver granted its keys for that
  // one); none: the poster's choice.
  std::optional<size_t> queue_pair;
};

struct TransferDone {
  uint64_t transfer = 0;
  Status status;  // an error names the queue pair and the completion status
};

class WritePoster {
 public:
  static constexpr size_t kMaxChain = 32;
  // Bytes posted to one queue pair per call at most (and at least one
  // write): posting to a software device (soft-RoCE, about 50 MB/s in a VM)
  // does the device's work inline, and a thread that posted a whole backlog
  // at once would miss its heartbeats for seconds. The rest goes as
  // completions come (a posted chain's last write is signaled, so one
  // always comes).
  static constexpr uint64_t kMaxPostBytesPerCall = 1u << 20;

  // `queue_pairs`: a peer rank's, not owned, at least one.
  explicit WritePoster(std::vector<QueuePair*> queue_pairs, uint32_t signal_every = 16);

  // Queues a transfer (at least one write) on its queue pair, or the next
  // working one, and posts what fits now. Fails at once, with a completion,
  // when that queue pair (or every one) has failed.
  void submit(LayerWrite transfer);
  // The queue pair a transfer should name, round robin over those that
  // work; none when every one has failed.
  std::optional<size_t> next_queue_pair();
  // Posts what waits and reaps completions; appends every transfer that
  // ended since the last call, each once.
  void progress(std::vector<TransferDone>& done);

  size_t transfers_in_flight() const;
  // A queue pair that failed (its transfers were answered): replace it.
  bool failed(size_t index) const { return lanes_[index].failed; }
  void replace(size_t index, QueuePair* queue_pair);
  size_t queue_pairs() const { return lanes_.size(); }

 private:
  struct Posted {
    uint64_t transfer;
    uint64_t last_wr_id;  // its transfer is done when this completes
  };
  struct Waiting {
    LayerWrite transfer;
    size_t next = 0;  // first write not yet posted
  };
  struct Lane {
    QueuePair* qp = nullptr;
    uint32_t capacity = 0;  // send-queue slots we may use
    uint32_t outstanding = 0;
    uint64_t next_wr_id = 1;
    // Posted writes after the last signaled one: the next signaled write
    // frees them too (and the next chain counts its signal spacing from them).
    uint32_t uncovered = 0;
    std::deque<std::pair<uint64_t, uint32_t>> signals;  // (wr_id, writes it frees)
    std::deque<Waiting> waiting;
    std::deque<Posted> posted;
    bool failed = false;
  };

  void post(Lane& lane, std::vector<TransferDone>& done);
  void reap(Lane& lane, std::vector<TransferDone>& done);
  void fail(Lane& lane, const std::string& why, std::vector<TransferDone>& done);
  Lane* next_lane();

  std::vector<Lane> lanes_;
  uint32_t signal_every_;
  size_t round_robin_ = 0;
  std::vector<TransferDone> early_;  // answered inside submit()
  std::vector<WriteRequest> chain_;  // scratch
};

}  // namespace kvrelay::worker::rdma
