// Staging for the tcp transport on a pool in GPU memory. The network threads
// read and write payloads with the CPU (sendmsg, recv), which cannot touch
// device memory; so a GPU pool's payloads go through page-locked host
// memory: the sender gathers a batch of frames device->host into a staging
// slot and writes them from there, the receiver reads a payload into a slot
// and copies it host->device before it counts as landed.
//
// The copies run on a thread of the Stager's own, on a copy engine
// (kernels/copy_engine.h; cudaMemcpyBatchAsync on the copy engines for a
// CUDA pool), so that a network thread never waits for the GPU. Each batch
// ends with a callback on that thread, which posts back to the connection's
// strand. Batches end in the order they were queued (one engine, one stream).
//
// Memory: each connection that moves GPU bytes has its own StagingSlots
// (two slots, so that copying one overlaps sending or receiving the other),
// made once its handshake is done (so that a ConnectTask also pays for the
// page-locking, not the first transfer) and freed with it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "instance/pool_geometry.h"
#include "kernels/copy_engine.h"
#include "kernels/host_pinning.h"
#include "shm/result.h"

namespace kvrelay::worker::tcp {

// One copy of a staged batch: `bytes` from `src` to `dst`, one of them in
// the pool's memory and the other in a staging slot.
struct StagedCopy {
  const std::byte* src;
  std::byte* dst;
  uint64_t bytes;
};

// A connection's staging memory: `count` slots of `slot_bytes` each, in
// anonymous host pages that are page-locked when the engine needs it. A slot
// is taken for one batch and given back when the batch is written (sender)
// or on the device (receiver).
class StagingSlots {
 public:
  // `pin`: page-locked by GPU `device`'s context (on whichever thread).
  static Result<std::unique_ptr<StagingSlots>> create(uint64_t slot_bytes, uint32_t count, bool pin,
                                                      int device = -1);
  ~StagingSlots();
  StagingSlots(const StagingSlots&) = delete;
  StagingSlots& operator=(const StagingSlots&) = delete;

  uint64_t slot_bytes() const { return slot_bytes_; }
  // A free slot's index, or -1 when every slot is busy.
  int take();
  void give_back(int slot);
  std::byte* slot(int index) const { return base_ + static_cast<uint64_t>(index) * slot_bytes_; }

 private:
  StagingSlots(std::byte* base, uint64_t mapped, uint64_t slot_bytes, uint32_t count)
      : base_(base), mapped_(mapped), slot_bytes_(slot_bytes), free_((1u << count) - 1) {}
  std::byte* base_;
  uint64_t mapped_;
  uint64_t slot_bytes_;
  uint32_t free_;  // bit i: slot i is free
  kernels::PinnedHostRange pinned_;
};

// The largest block of any tensor of `g`: a slot holds at least one, so that
// a sender's frames split into whole blocks (what a receiver accepts).
uint64_t largest_block_bytes(const PoolGeometry& g);

class Stager {
 public:
  enum class Direction { kToHost, kToDevice };
  struct Options {
    uint64_t slot_bytes = 8ull << 20;  // at least the pool's largest block
    uint32_t slots = 2;                // per connection
    bool pin = true;                   // page-lock the slots (a CUDA engine's copies)
    int device = -1;                   // the pool's GPU, which pins them (host_pinning.h)
  };

  // `engine` reaches the pool's memory (`pool_kind`) and host memory.
  Stager(std::unique_ptr<kernels::CopyEngine> engine, kernels::MemoryKind pool_kind,
         Options options);
  ~Stager();  // ends every queued batch (each callback runs) and joins
  Stager(const Stager&) = delete;
  Stager& operator=(const Stager&) = delete;

  // Staging memory for one connection, its slots at least `min_slot_bytes`.
  // Any thread.
  Result<std::unique_ptr<StagingSlots>> make_slots(uint64_t min_slot_bytes) const;
  // How many connections' slots it made so far.
  uint64_t slot_sets_made() const { return slot_sets_made_.load(std::memory_order_relaxed); }

  // Queues a batch; `done(status)` runs on the stager's thread once it has
  // ended (landed, or failed: then every later batch fails too). Callable
  // from any thread.
  void copy(Direction direction, std::vector<StagedCopy> copies, std::function<void(Status)> done);
  // Blocks until every batch queued so far has ended and its callback ran:
  // after it, no staged copy touches the pool.
  void drain();

 private:
  struct Batch {
    Direction direction;
    std::vector<StagedCopy> copies;
    std::function<void(Status)> done;
  };
  void run();
  // Submits `batch` to the engine; its ticket, or why it did not start.
  Result<kernels::CopyTicket> submit(const Batch& batch);

  std::unique_ptr<kernels::CopyEngine> engine_;
  kernels::MemoryKind pool_kind_;
  Options options_;
  mutable std::atomic<uint64_t> slot_sets_made_{0};
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Batch> queued_;
  uint64_t queued_count_ = 0, ended_count_ = 0;
  bool stopping_ = false;
  // The thread's scratch, reused from batch to batch.
  std::vector<kernels::CopyRun> runs_;
  std::vector<kernels::TensorCopy> tensor_copies_;
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace kvrelay::worker::tcp
