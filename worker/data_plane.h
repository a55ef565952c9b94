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
// Not thread-safe: the worker's thread owns it.
#pragma once

#include <memory>
#include <string>

#include "instance/control_segment.h"
#include "schemas/kvrelay.capnp.h"
#include "shm/wait_event.h"
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
  // segment: refused while requests or swaps are in flight, or when the
  // segment is not a pool of this instance's geometry.
  PoolRegistration register_pool(schema::PoolDescriptor::Reader descriptor);

  SendScheduler& scheduler() { return *scheduler_; }
  Transports& transports() { return *transports_; }
  SwapEngine* swap() { return swap_.get(); }  // none without a host tier
  const LocalPool& device_pool() const { return *device_pool_; }
  const LocalPool* host_pool() const { return host_pool_.get(); }
  // The pool another process truncated, if any (the worker then exits).
  const LocalPool* truncated_pool() const;

 private:
  DataPlane(const ControlSegment& control, uint32_t rank, NetworkOptions network,
            WaitEvent& doorbell, Hooks hooks);
  // Builds the transports and the scheduler over the device pool.
  Status serve_device_pool();
  void start_swap_engine();

  const ControlSegment& control_;
  uint32_t rank_;
  NetworkOptions network_;
  WaitEvent& doorbell_;
  Hooks hooks_;
  std::unique_ptr<LocalPool> device_pool_;
  std::unique_ptr<LocalPool> host_pool_;
  std::unique_ptr<Transports> transports_;    // after the pools: it refers to them
  std::unique_ptr<SendScheduler> scheduler_;  // after the transports
  std::unique_ptr<SwapEngine> swap_;          // after the pools
};

}  // namespace kvrelay::worker
