#include "worker/net/completion_sink.h"

namespace kvrelay::worker::net {

void CompletionSink::push(TransferCompletion c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.push_back(std::move(c));
    any_.store(true, std::memory_order_release);
  }
  if (doorbell_ != nullptr) notify_waiters(*doorbell_);
}

void CompletionSink::take(std::vector<TransferCompletion>& out) {
  if (!any()) return;
  std::lock_guard<std::mutex> lock(mu_);
  out.insert(out.end(), std::make_move_iterator(ready_.begin()),
             std::make_move_iterator(ready_.end()));
  ready_.clear();
  any_.store(false, std::memory_order_release);
}

}  // namespace kvrelay::worker::net
