// Waits, on an asio executor (a connection's strand), for the completion
// events of a session's queue pairs (RcQueuePair::event_fd) and calls back
// there each time one fires, so that rdma completions are handled on the
// same strand as the control connection's messages: no thread of its own,
// no busy polling. The callback arms the queue pairs and polls them.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <memory>
#include <vector>

namespace kvrelay::worker::rdma {

class CompletionWatch {
 public:
  explicit CompletionWatch(boost::asio::any_io_executor executor) : executor_(executor) {}
  ~CompletionWatch() { stop(); }

  // Watches each fd (its own duplicate: the queue pair keeps the original).
  void start(const std::vector<int>& fds, std::function<void()> on_event);
  // Cancels the waits; the callback is not called after this returns (when
  // called on the executor).
  void stop();

 private:
  void wait(size_t i);

  boost::asio::any_io_executor executor_;
  std::vector<std::unique_ptr<boost::asio::posix::stream_descriptor>> fds_;
  std::function<void()> on_event_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace kvrelay::worker::rdma
