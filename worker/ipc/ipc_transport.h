// The `ipc` transport: the decode instance runs on this host, so the pool of
// the decode rank this rank sends to (the CacheDest's device_ids[rank]) is
// mapped into this worker, found through the decode instance's control
// segment and pool directory, and each layer moves through this transport's
// copy engine from the local pool into it. A transfer is complete when the
// engine says its copies landed; the completion follows a release fence, so
// a reader that learns of it (through the report, the coordinator and the
// completion ring) sees the bytes.
//
// The decode rank's claims are checked before each layer is written, and
// the rank is told what landed after (ipc_pool_writer.h), so that its
// expected requests (ExpectArrival) work as over tcp.
//
// The decode rank's pool is whatever its directory entry says: a host
// segment (mapped by name), or memory its engine registered (a tensor
// table: CUDA IPC handles, CUDA VMM fds, memfds), fetched from that rank's
// worker over its fd socket and mapped for this rank's copy engine (a GPU
// pool on another GPU is written by this rank's gather kernel, peer to
// peer). Mappings are dropped as soon as the peer's segment, or the pool its
// directory names, changes (release_stale(), every turn): a replaced or dead
// peer's memory is never held here longer than a copy in flight needs it.
//
// Heterogeneous TP (the decode instance has another tp_size): this rank's
// heads go to the decode ranks that hold them (instance/head_layout.h), so a
// destination has one part per such rank, each with its head range, and
// device_ids is not consulted. A layer still moves as one copy batch into
// every part, with one completion.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "instance/control_segment.h"
#include "instance/head_layout.h"
#include "instance/peer_instances.h"
#include "worker/ipc/ipc_pool_writer.h"
#include "worker/layer_copy.h"
#include "worker/local_pool.h"
#include "worker/reused_fifo.h"
#include "worker/transport.h"

namespace kvrelay::worker {

class IpcTransport final : public Transport {
 public:
  // `heads`: how this instance spreads the model's KV heads over its ranks;
  // `instance`: this instance's name, which its landed records carry (a
  // decode engine may expect a request from it alone).
  IpcTransport(uint32_t rank, const LocalPool& local, std::unique_ptr<kernels::CopyEngine> engine,
               HeadLayout heads = {}, std::string instance = {});
  ~IpcTransport() override;

  const char* name() const override { return "ipc"; }
  Result<std::shared_ptr<Destination>> resolve(schema::CacheDest::Reader dest) override;
  Status check_connect(schema::ConnectTask::Reader connect) override;
  void poll(std::vector<TransferCompletion>& out) override;
  bool has_completions() const override { return !in_flight_.empty(); }
  // flush_landed() and release_stale().
  bool tick() override {
    flush_landed();
    release_stale();
    return false;
  }
  // Sends the landed records that waited for room in a decode rank's writer
  // ring (call every turn; cheap when none wait).
  void flush_landed();
  // Drops the mappings of peers whose segment or published pool changed
  // (looks at most every 200 ms; call every turn). Returns how many went.
  size_t release_stale();
  // Peer pools mapped now (for tests and the dump).
  size_t mapped_pools() const { return pools_.size(); }

  // Decode rank `peer_rank`'s pool of `peer_instance`, mapped (cached while
  // the peer's coordinator lives).
  Result<std::shared_ptr<const LocalPool>> peer_pool(const std::string& peer_instance,
                                                     uint32_t peer_rank);
  // A destination for an already mapped pool (benchmarks, tests); `writer`
  // (optional) is the decode rank's.
  std::shared_ptr<Destination> destination_for(std::shared_ptr<const LocalPool> peer,
                                               std::string peer_name,
                                               std::shared_ptr<IpcPoolWriter> writer = {});
  // The same into several mapped pools, a head range into each
  // (heterogeneous TP; benchmarks, tests).
  std::shared_ptr<Destination> split_destination_for(
      std::vector<std::pair<std::shared_ptr<const LocalPool>, HeadShare>> parts, std::string name);

 private:
  class PoolDestination;
  // One decode rank a destination writes into.
  struct Part {
    std::shared_ptr<const LocalPool> pool;
    std::shared_ptr<IpcPoolWriter> writer;  // none for pools mapped by hand
    std::optional<HeadShare> share;           // heterogeneous TP: only these heads
  };
  struct Scratch {
    LayerCopyScratch copy;  // the runs the engine reads until done
    std::vector<CopyTarget> targets;
    std::vector<BlockRun> runs;        // for the decode ranks' receivers
    std::vector<const Part*> tracked;  // the parts whose receivers were told (same order)
  };
  struct InFlight {
    TransferTicket ticket;
    kernels::CopyTicket copy;
    uint64_t bytes;
    uint32_t layer;
    std::shared_ptr<const std::vector<Part>> parts;  // held while the copy may write them
    std::unique_ptr<Scratch> scratch;
  };
  Status submit(const TransferTicket& ticket, uint32_t layer, std::span<const BlockRun> runs,
                const std::shared_ptr<const std::vector<Part>>& parts);
  Result<std::shared_ptr<Destination>> resolve_split(schema::CacheDest::Reader dest,
                                                     const std::string& instance);
  // The decode ranks this rank writes into: its own rank with the same
  // layout, else those its head shares name.
  Result<std::vector<uint32_t>> decode_ranks(const std::string& instance);
  // The peer holds this model's cache: the same kind (K only, or K and V) and the
  // same KV heads in all.
  Status same_model(const std::string& instance, const InstanceConfig& peer) const;
  struct Mapped {
    // The peer segment it was found through (held: a successor's segment
    // can never be mistaken for it).
    std::shared_ptr<const ControlSegment> control;
    std::shared_ptr<const LocalPool> pool;
    std::shared_ptr<IpcPoolWriter> writer;
  };
  Result<Mapped> mapped(const std::string& peer_instance, uint32_t peer_rank);
  // The decode rank's engine-registered pool, from its fd socket.
  Result<std::shared_ptr<const LocalPool>> fetch_tensor_table(const std::string& peer_instance,
                                                              uint32_t peer_rank,
                                                              const ControlSegment& control,
                                                              const PublishedPool& published);
  void note_backlog(const std::shared_ptr<IpcPoolWriter>& writer);

  uint32_t rank_;
  const LocalPool& local_;
  HeadLayout heads_;
  std::string instance_;  // this instance's: the writer its landed records name
  std::unique_ptr<kernels::CopyEngine> engine_;
  PeerInstances peers_;
  std::unordered_map<std::string, Mapped> pools_;  // by "<instance>/<rank>"
  uint64_t next_stale_check_ns_ = 0;
  ReusedFifo<InFlight> in_flight_;
  std::vector<std::unique_ptr<Scratch>> spare_scratch_;       // no allocation per layer
  std::vector<std::shared_ptr<IpcPoolWriter>> backlogged_;  // receivers with records waiting
};

}  // namespace kvrelay::worker
