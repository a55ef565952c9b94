// Completions on their way from the network threads to the worker's: a
// network transport's strands push each transfer's end here, and the
// worker's loop takes them (Transport::poll), woken through its doorbell.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

#include "shm/wait_event.h"
#include "worker/transport.h"

namespace kvrelay::worker::net {

class CompletionSink {
 public:
  explicit CompletionSink(WaitEvent* doorbell) : doorbell_(doorbell) {}
  // Any thread.
  void push(TransferCompletion c);
  // The worker's thread.
  void take(std::vector<TransferCompletion>& out);
  bool any() const { return any_.load(std::memory_order_acquire); }

 private:
  std::mutex mu_;
  std::vector<TransferCompletion> ready_;
  std::atomic<bool> any_{false};
  WaitEvent* doorbell_;
};

}  // namespace kvrelay::worker::net
