#include "worker/swap_engine.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "schemas/codec.h"
#include "worker/copy_plan.h"

namespace kvrelay::worker {

SwapEngine::SwapEngine(uint32_t rank, const LocalPool& device, const LocalPool& host,
                       std::unique_ptr<kernels::CopyEngine> engine, SwapProgressTable* progress,
                       WaitEvent& doorbell)
    : rank_(rank),
      device_(device),
      host_(host),
      engine_(std::move(engine)),
      progress_(progress),
      doorbell_(doorbell) {
  thread_ = std::thread([this] { run(); });
}

SwapEngine::~SwapEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SwapEngine::submit(uint64_t handle, schema::SwapTask::Reader task, uint32_t progress_slot,
                        uint32_t progress_generation) {
  Op op;
  op.handle = handle;
  op.id = task.getRequestId().cStr();
  op.load = task.getDirection() == schema::SwapTask::Direction::LOAD;
  op.device_ids = messages::to_vector(task.getDeviceBlockIds());
  op.host_ids = messages::to_vector(task.getHostBlockIds());
  op.first_layer = task.getFirstLayer();
  const uint32_t total = device_.geometry().total_layers();
  op.layer_count = task.getLayerCount() != 0
                       ? task.getLayerCount()
                       : (op.first_layer < total ? total - op.first_layer : 0);
  op.progress_slot = progress_slot;
  op.progress_generation = progress_generation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    (op.load ? loads_ : evictions_).push_back(std::move(op));
  }
  cv_.notify_all();
}

bool SwapEngine::cancel(uint64_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto* queue : {&loads_, &evictions_}) {
    for (Op& op : *queue) {
      if (op.handle == handle) {
        op.cancelled = true;
        cv_.notify_all();
        return true;
      }
    }
  }
  return false;
}

std::vector<SwapReport> SwapEngine::take_reports() {
  std::lock_guard<std::mutex> lock(mu_);
  reports_ready_.store(0, std::memory_order_relaxed);
  return std::exchange(outbox_, {});
}

size_t SwapEngine::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loads_.size() + evictions_.size();
}

void SwapEngine::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !loads_.empty() || !evictions_.empty(); });
    if (stop_) {
      // Layers still queued write into the pools, which go next.
      for (auto* queue : {&loads_, &evictions_})
        if (!queue->empty()) drain(queue->front());
      return;
    }
    // Loads first; evictions only when no load waits. An op whose layers
    // are queued stays at the front until they landed.
    std::deque<Op>* queue = !loads_.empty() ? &loads_ : &evictions_;
    if (!evictions_.empty() && evictions_.front().queued > evictions_.front().next_layer)
      queue = &evictions_;
    Op& op = queue->front();
    if (op.queued == op.next_layer && (op.cancelled || op.next_layer == op.layer_count)) {
      report(op, op.cancelled ? records::ReportKind::kCancelled : records::ReportKind::kFinished,
             "");
      queue->pop_front();
      continue;
    }
    // An eviction with layers queued when a load arrives only lands them.
    const bool queue_more = !(queue == &evictions_ && !loads_.empty());
    // Copy without the lock; the queues may grow meanwhile but this op stays
    // at its front (only this thread pops).
    Op* current = &op;
    lock.unlock();
    const std::string error = advance(*current, queue_more);
    lock.lock();
    if (!error.empty()) {
      report(*current, records::ReportKind::kFailed, error);
      queue->pop_front();
    }
  }
}

std::string SwapEngine::advance(Op& op, bool queue_more) {
  // Queue up to the window, unless the op was cancelled meanwhile.
  while (queue_more && op.queued < op.layer_count && op.queued - op.next_layer < kLayersInFlight) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (op.cancelled) break;
    }
    if (std::string error = queue_layer(op); !error.empty()) {
      drain(op);
      return error;
    }
  }
  if (op.queued == op.next_layer) return {};  // cancelled, or yielding, with nothing queued
  Queued& oldest = window_[op.next_layer % kLayersInFlight];
  if (Status s = engine_->wait(oldest.ticket); !s) {
    drain(op);
    return s.error().message;
  }
  const LocalPool& from = op.load ? host_ : device_;
  const LocalPool& to = op.load ? device_ : host_;
  if (Status s = check_both_intact(from, to); !s) {
    drain(op);
    return s.error().message;
  }
  op.bytes += oldest.bytes;
  ++op.next_layer;
  if (op.load) publish_progress(op);
  return {};
}

std::string SwapEngine::queue_layer(Op& op) {
  const uint32_t layer = op.first_layer + op.queued;
  const LocalPool& from = op.load ? host_ : device_;
  const LocalPool& to = op.load ? device_ : host_;
  const auto& from_ids = op.load ? op.host_ids : op.device_ids;
  const auto& to_ids = op.load ? op.device_ids : op.host_ids;
  Result<std::vector<BlockRun>> runs =
      plan_block_runs(from_ids, to_ids, from.geometry().blocks_in_layer(layer),
                      to.geometry().blocks_in_layer(layer), rank_, layer);
  if (!runs) return runs.error().message;
  if (op.first_copy_ns == 0) op.first_copy_ns = mono_now_ns();
  Queued& slot = window_[op.queued % kLayersInFlight];
  // A load's layer is read by the engine as soon as it is published: kept
  // in the cache (an eviction's goes to the host tier, read much later).
  Result<StartedLayerCopy> copy =
      start_layer_copy(*engine_, from, to, layer, *runs, slot.scratch, /*read_soon=*/op.load);
  if (!copy) return copy.error().message;
  slot.ticket = copy->ticket;
  slot.bytes = copy->bytes;
  ++op.queued;
  return {};
}

void SwapEngine::drain(Op& op) {
  for (; op.next_layer < op.queued; ++op.next_layer)
    (void)engine_->wait(window_[op.next_layer % kLayersInFlight].ticket);
}

void SwapEngine::publish_progress(const Op& op) {
  // After the copies (release): a reader that sees layer i done sees its bytes.
  if (progress_ != nullptr)
    swap_progress::publish(*progress_, op.progress_slot, op.progress_generation, rank_,
                           op.next_layer);
}

void SwapEngine::report(const Op& op, records::ReportKind kind, const std::string& message) {
  outbox_.push_back(SwapReport{op.handle, kind, op.bytes, message, op.first_copy_ns});
  reports_ready_.fetch_add(1, std::memory_order_release);
  notify_waiters(doorbell_);
}

}  // namespace kvrelay::worker
