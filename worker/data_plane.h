// A rank's data plane: its pools (device, and host with a host tier), the
// transports over the device pool, the send scheduler over the transports,
// and the swap engine over both pools, built together and rebuilt together
// when the engine registers a pool of its own (RegisterPool). The worker's
// loop (worker.cpp) feeds it tasks and signals and reports what it says.
//
// Destruction order is the point of keeping them in one place: the swap
// engine and the scheduler go before the transports, and the transports (a
// tcp listener writes into the device pool from its network thread) before
// the pools they refer to.
//
// Pools the engine registers: a host segment (by name), or a tensor table
// of memory the engine allocated (CUDA IPC handles, CUDA VMM fds, memfds;
// worker/imported_pool.h), whose fds reach the worker through its fd
// socket (worker/fd_socket_server.h). A tensor-table pool is offered to peer
// workers through that socket too, so that a prefill worker on this host
// can map it for ipc. A GPU device pool gets the CUDA copy engine, and the
// host tier is pinned for its copies. The process that allocated such a
// pool is watched (a pidfd): once it exits, the worker lets go of its memory
// and serves a pool of its own again, so a dead engine's GPU memory is never
// held here.
//
// Not thread-safe: the worker's thread owns it.
#pragma once

#include <memory>
#include <string>

#include "instance/control_segment.h"
#include "kernels/host_pinning.h"
#include "schemas/kvrelay.capnp.h"
#include "shm/process_exit_watch.h"
#include "shm/wait_event.h"
#include "worker/fd_socket_server.h"
#include "worker/local_pool.h"
#include "worker/send_scheduler.h"
#include "worker/swap_engine.h"
#include "worker/transports.h"

namespace kvrelay::worker {

// What became of a RegisterPool.
struct PoolRegistration {
  bool registered = false;
  // Refused (registered false): nothing changed. Broken: the old pool is
  // gone and the new one could not be served (the worker must exit).
  bool broken = false;
  std::string message;
};

class DataPlane {
 public:
  struct Hooks {
    SendScheduler::Reporter report;          // a request's end on this rank
    SendScheduler::LatencyObserver latency;  // each layer copy
    SendScheduler::HopObserver hop;          // the dispatch and completion hops it times
  };

  // Maps (or creates) rank `rank`'s pools of `control`'s instance and builds
  // everything over them. `doorbell`: the worker's, rung by the transports
  // and the swap engine.
  static Result<std::unique_ptr<DataPlane>> open(const ControlSegment& control, uint32_t rank,
                                                 const NetworkOptions& network, WaitEvent& doorbell,
                                                 Hooks hooks);
  ~DataPlane();
  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  // Replaces the rank's pool of the descriptor's tier with the engine's
  // memory: refused while requests or swaps are in flight, or when the
  // memory is not a pool of this instance's geometry.
  PoolRegistration register_pool(schema::PoolDescriptor::Reader descriptor);

  // Whether the rank has a device pool, and so the transports and the
  // scheduler over it. Not while the instance runs with --pool none and the
  // engine has registered no pool (or the one it registered was let go of).
  bool serving() const { return device_pool_ != nullptr; }
  // Why it is not serving, for the request that needed it.
  std::string no_pool_reason() const;
  // Only while serving().
  SendScheduler& scheduler() { return *scheduler_; }
  Transports& transports() { return *transports_; }
  SwapEngine* swap() { return swap_.get(); }  // none without a host tier
  const LocalPool* device_pool() const { return device_pool_.get(); }
  const LocalPool* host_pool() const { return host_pool_.get(); }
  // The pool another process truncated, if any (the worker then exits).
  const LocalPool* truncated_pool() const;
  // Lets go of engine-registered pools whose owner process exited (once no
  // request or swap uses them), serving the rank's own pool again. Cheap;
  // call every 100 ms or so. `broken` as for register_pool.
  PoolRegistration release_orphaned_pools();
  // The rank's fd socket; none when it could not listen (fd registrations
  // are then refused, saying why).
  FdSocketServer* fd_socket_server() { return fd_server_.get(); }

 private:
  DataPlane(const ControlSegment& control, uint32_t rank, NetworkOptions network,
            WaitEvent& doorbell, Hooks hooks);
  // Builds the transports and the scheduler over the device pool.
  Status serve_device_pool();
  // --pool none, once the engine's pool was let go of: back to no pool.
  void stop_serving();
  // Requests or swaps in flight.
  bool busy() const;
  void start_swap_engine();
  // The engine's tensor table: maps it and returns it with the fds to offer
  // peers (moved out of `fds`).
  // `ticket`: the registration's (its fds', or a fresh one for legacy handles).
  Result<std::unique_ptr<LocalPool>> import_tensor_table(schema::PoolDescriptor::Reader d,
                                                         PoolTier tier, std::vector<UniqueFd>& fds,
                                                         uint64_t& ticket);

  const ControlSegment& control_;
  uint32_t rank_;
  NetworkOptions network_;
  WaitEvent& doorbell_;
  Hooks hooks_;
  // Replaces the rank's pool of `tier` with `pool` and rebuilds what sits on it.
  PoolRegistration serve(PoolTier tier, std::unique_ptr<LocalPool> pool);

  std::unique_ptr<FdSocketServer> fd_server_;
  // Per tier: the process that owns the engine-registered pool being served,
  // or none.
  ProcessExitWatch owner_[2];
  uint32_t exited_owner_pid_ = 0;  // --pool none: the exited owner of the pool let go of
  std::string no_fd_server_;  // why there is none
  std::unique_ptr<LocalPool> device_pool_;
  std::unique_ptr<LocalPool> host_pool_;
  std::vector<kernels::PinnedHostRange> pinned_host_;  // the host tier, while a GPU pool swaps
                                                       // with it
  std::unique_ptr<Transports> transports_;             // after the pools: it refers to them
  std::unique_ptr<SendScheduler> scheduler_;           // after the transports
  std::unique_ptr<SwapEngine> swap_;                   // after the pools
};

}  // namespace kvrelay::worker
