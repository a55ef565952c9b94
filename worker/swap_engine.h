// Swap between this rank's device tier and host tier (the original's
// transfer manager), on a thread of its own so that swaps and prefill->decode
// sends never wait for each other.
//
// Order: loads go first - they gate the engine's forward pass - in the order
// they arrived, layer by layer; as each layer lands the load's progress slot
// is raised and its waiters (Client::wait_layer, or a GPU stream waiting on
// the counter) are woken. Evictions run in the background in arrival order,
// whenever no load is waiting.
//
// Pipelined: up to kLayersInFlight layers of the op at the front are queued
// on the copy engine at once (a GPU engine runs them back to back on its
// stream, each with its event), and each is published when its ticket says
// it landed, in order. A cancel takes effect at the next layer not yet
// queued; the queued ones land before the cancel is reported (they write the
// op's blocks). Nothing orders an eviction against a later load of the same
// host blocks: the engine waits for the eviction's completion before loading
// them back.
//
// Thread-safety: submit/cancel/knows/take_reports are called by the worker's
// main thread; the copies and progress updates happen on the swap thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "instance/instance_status.h"
#include "instance/swap_progress.h"
#include "kernels/copy_engine.h"
#include "schemas/kvrelay.capnp.h"
#include "schemas/records.h"
#include "shm/wait_event.h"
#include "worker/layer_copy.h"
#include "worker/local_pool.h"

namespace kvrelay::worker {

struct SwapReport {
  uint64_t handle;
  records::ReportKind kind;
  uint64_t bytes;
  std::string message;
  uint64_t first_copy_ns;  // when its first layer's copy began; 0: none
};

class SwapEngine {
 public:
  // `doorbell` is rung whenever a report is ready for take_reports().
  // Layers move through `engine`, on the swap thread only.
  SwapEngine(uint32_t rank, const LocalPool& device, const LocalPool& host,
             std::unique_ptr<kernels::CopyEngine> engine, SwapProgressTable* progress,
             WaitEvent& doorbell);
  ~SwapEngine();
  SwapEngine(const SwapEngine&) = delete;
  SwapEngine& operator=(const SwapEngine&) = delete;

  void submit(uint64_t handle, schema::SwapTask::Reader task, uint32_t progress_slot,
              uint32_t progress_generation);
  // True if the handle was a swap of this engine (it will report kCancelled).
  [[nodiscard]] bool cancel(uint64_t handle);
  std::vector<SwapReport> take_reports();
  bool has_reports() const { return reports_ready_.load(std::memory_order_acquire) != 0; }
  size_t pending() const;

 private:
  struct Op {
    uint64_t handle;
    std::string id;
    bool load;
    std::vector<uint32_t> device_ids;
    std::vector<uint32_t> host_ids;
    uint32_t first_layer;
    uint32_t layer_count;
    uint32_t next_layer = 0;  // layers landed so far, from first_layer
    uint32_t queued = 0;      // layers handed to the copy engine so far (>= next_layer)
    uint32_t progress_slot;
    uint32_t progress_generation;
    uint64_t bytes = 0;
    uint64_t first_copy_ns = 0;
    bool cancelled = false;
  };
  static constexpr uint32_t kLayersInFlight = 4;
  void run();
  // Queues layers of `op` up to the window (with `queue_more`), then waits
  // for the oldest and publishes it; returns an error message, or empty.
  std::string advance(Op& op, bool queue_more);
  // Queues the next layer of `op`.
  std::string queue_layer(Op& op);
  // Waits for every queued layer of `op` (before it is reported).
  void drain(Op& op);
  void publish_progress(const Op& op);
  void report(const Op& op, records::ReportKind kind, const std::string& message);

  uint32_t rank_;
  const LocalPool& device_;
  const LocalPool& host_;
  std::unique_ptr<kernels::CopyEngine> engine_;
  SwapProgressTable* progress_;
  WaitEvent& doorbell_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> loads_;
  std::deque<Op> evictions_;
  std::vector<SwapReport> outbox_;
  std::atomic<uint32_t> reports_ready_{0};
  bool stop_ = false;
  std::thread thread_;
  // The runs of each layer in flight, until its ticket lands: one per slot
  // of the window, used round robin.
  struct Queued {
    kernels::CopyTicket ticket = 0;
    uint64_t bytes = 0;
    LayerCopyScratch scratch;
  };
  Queued window_[kLayersInFlight];
};

}  // namespace kvrelay::worker
