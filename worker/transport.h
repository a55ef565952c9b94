// The data plane's seam (DESIGN.md section 6): the send scheduler decides
// which layer of which blocks moves, and a transport moves them. Submission
// and completion are apart: submit_layer() starts a layer's transfer and
// returns at once; the transfer's completion, polled later, says that its
// bytes are applied at the destination (readable there, not merely handed to
// a socket), or why they are not. Each protocol's transport lives in a
// folder of its own (ipc/, tcp/, rdma/) and is built by its row of the
// registry (transport_registry.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "schemas/kvrelay.capnp.h"
#include "shm/result.h"
#include "worker/copy_plan.h"

namespace kvrelay::worker {

// Which layer of which request a transfer carries; its completion hands it
// back unchanged.
struct TransferTicket {
  uint64_t handle = 0;          // the request
  uint64_t request_serial = 0;  // which binding of that handle (the scheduler's count)
  uint64_t request_key = 0;     // request_key() of its id: names it to the receiver
  // One past the request's largest destination block (0: not checked). A
  // network sender learns the receiver's pool only when it connects, and
  // checks this against it before the first byte of every layer, so that a
  // request naming a block the pool lacks writes nothing anywhere.
  uint32_t dst_block_end = 0;
  uint32_t layer = 0;
  uint64_t signal_ns = 0;  // when the signal that let this layer go was read
  uint64_t submit_ns = 0;
};

struct TransferCompletion {
  TransferTicket ticket;
  uint64_t bytes = 0;  // applied at the destination
  Status status;       // an error names the peer and the cause
};

// Where one request's blocks go from this rank: resolved once per request.
class Destination {
 public:
  virtual ~Destination() = default;
  // Blocks the destination pool holds in `layer` (for the range check).
  virtual uint32_t blocks_in_layer(uint32_t layer) const = 0;
  // The peer, for messages: "decode instance 'd0' rank 1 over ipc".
  virtual const std::string& peer() const = 0;
  // Starts moving every tensor of `layer` (K, V and scales) for `runs` from
  // the local pool; transfers_per_submit() completions with `ticket`
  // follow. An error here means nothing was started and no completion
  // follows.
  virtual Status submit_layer(const TransferTicket& ticket, uint32_t layer,
                              std::span<const BlockRun> runs) = 0;
  // Completions that follow each successful submit_layer(): one, or one per
  // decode rank a network transport writes into (heterogeneous TP; none for
  // a rank whose heads other ranks send).
  virtual uint32_t transfers_per_submit() const { return 1; }
};

class Transport {
 public:
  virtual ~Transport() = default;
  // "ipc", "tcp", "rdma": for messages and the registry.
  virtual const char* name() const = 0;
  virtual Result<std::shared_ptr<Destination>> resolve(schema::CacheDest::Reader dest) = 0;
  // For ConnectTask: can this rank reach the peer? ok or why not.
  virtual Status check_connect(schema::ConnectTask::Reader connect) = 0;
  // Appends the completions of transfers finished since the last call, each
  // once, in the order they finished.
  virtual void poll(std::vector<TransferCompletion>& out) = 0;
  // Whether poll() has something to return (the worker's wait predicate).
  virtual bool has_completions() const = 0;
  // Work of every turn of the worker's loop; true when something was done.
  virtual bool tick() { return false; }
};

}  // namespace kvrelay::worker
