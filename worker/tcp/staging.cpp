#include "worker/tcp/staging.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <bit>
#include <cerrno>
#include <cstring>

namespace kvrelay::worker::tcp {

uint64_t largest_block_bytes(const PoolGeometry& g) {
  uint64_t largest = 0;
  for (uint32_t slot = 0; slot < g.tensors_per_layer(); ++slot)
    largest = std::max(largest, g.block_bytes(g.tensor_at(slot)));
  return largest;
}

Result<std::unique_ptr<StagingSlots>> StagingSlots::create(uint64_t slot_bytes, uint32_t count,
                                                           bool pin, int device) {
  if (count == 0 || count > 32 || slot_bytes == 0)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("staging: {} slots of {} bytes", count, slot_bytes));
  const uint64_t bytes = slot_bytes * count;
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED)
    return make_error(Errc::kSystem, fmt::format("cannot map {} bytes of staging memory: {}", bytes,
                                                 std::strerror(errno)));
  std::unique_ptr<StagingSlots> slots(
      new StagingSlots(static_cast<std::byte*>(base), bytes, slot_bytes, count));
  if (pin) {
    // Made on a network thread, which has no GPU of its own: the pool's.
    Result<kernels::PinnedHostRange> pinned =
        kernels::PinnedHostRange::pin(base, bytes, /*mapped=*/false, device);
    if (!pinned)
      return make_error(pinned.error().code,
                        fmt::format("cannot page-lock {} bytes of tcp staging memory for the "
                                    "GPU's copies: {}",
                                    bytes, pinned.error().message));
    slots->pinned_ = std::move(pinned).value();
  }
  return slots;
}

StagingSlots::~StagingSlots() {
  pinned_ = kernels::PinnedHostRange();  // unpinned before the pages go
  ::munmap(base_, mapped_);
}

int StagingSlots::take() {
  if (free_ == 0) return -1;
  const int slot = std::countr_zero(free_);
  free_ &= ~(1u << slot);
  return slot;
}

void StagingSlots::give_back(int slot) {
  free_ |= 1u << slot;
}

Stager::Stager(std::unique_ptr<kernels::CopyEngine> engine, kernels::MemoryKind pool_kind,
               Options options)
    : engine_(std::move(engine)),
      pool_kind_(pool_kind),
      options_(options),
      thread_([this] { run(); }) {}

Stager::~Stager() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

Result<std::unique_ptr<StagingSlots>> Stager::make_slots(uint64_t min_slot_bytes) const {
  Result<std::unique_ptr<StagingSlots>> slots = StagingSlots::create(
      std::max(options_.slot_bytes, min_slot_bytes), options_.slots, options_.pin, options_.device);
  if (slots) slot_sets_made_.fetch_add(1, std::memory_order_relaxed);
  return slots;
}

void Stager::copy(Direction direction, std::vector<StagedCopy> copies,
                  std::function<void(Status)> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_.push_back(Batch{direction, std::move(copies), std::move(done)});
    ++queued_count_;
  }
  changed_.notify_all();
}

void Stager::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = queued_count_;
  changed_.wait(lock, [&] { return ended_count_ >= target; });
}

Result<kernels::CopyTicket> Stager::submit(const Batch& batch) {
  const bool to_host = batch.direction == Direction::kToHost;
  const kernels::MemoryKind src_kind = to_host ? pool_kind_ : kernels::MemoryKind::kHost;
  const kernels::MemoryKind dst_kind = to_host ? kernels::MemoryKind::kHost : pool_kind_;
  runs_.clear();
  tensor_copies_.clear();
  for (const StagedCopy& c : batch.copies)
    runs_.push_back(kernels::CopyRun{0, 0, c.bytes});
  for (size_t i = 0; i < batch.copies.size(); ++i)
    tensor_copies_.push_back(kernels::TensorCopy{batch.copies[i].src, batch.copies[i].dst,
                                                 std::span<const kernels::CopyRun>(&runs_[i], 1),
                                                 src_kind, dst_kind});
  return engine_->submit(tensor_copies_);
}

// One batch at a time: the engine's spans (runs_) must stay valid until its
// ticket is done, and a batch is a slot of megabytes, so waiting between
// batches costs little next to the copy.
void Stager::run() {
  for (;;) {
    Batch batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return stopping_ || !queued_.empty(); });
      if (queued_.empty()) return;  // stopping, and nothing is left
      batch = std::move(queued_.front());
      queued_.pop_front();
    }
    Status outcome = engine_->failure();
    if (outcome) {
      Result<kernels::CopyTicket> ticket = submit(batch);
      outcome = ticket ? engine_->wait(*ticket) : Status(ticket.error());
    }
    if (!outcome)
      outcome = make_error(outcome.error().code,
                           fmt::format("staging {} GPU memory on {} failed: {}",
                                       batch.direction == Direction::kToHost ? "from" : "into",
                                       engine_->name(), outcome.error().message));
    batch.done(std::move(outcome));
    // Its callback's captures end here, before drain() can return: none may
    // outlive the transport that waits in drain().
    batch = Batch{};
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++ended_count_;
    }
    changed_.notify_all();
  }
}

}  // namespace kvrelay::worker::tcp
