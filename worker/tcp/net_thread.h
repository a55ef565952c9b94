// The thread that runs a worker's network I/O (tcp listener and tcp lanes):
// one Boost.Asio io_context, driven by one thread, so every connection's
// state is touched by that thread only. The worker's loop hands work to it
// with asio::post and learns of results through the transport's completions.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <thread>

namespace kvrelay::worker::tcp {

class NetThread {
 public:
  NetThread();
  ~NetThread();  // stops the loop and joins: handlers never run after this
  NetThread(const NetThread&) = delete;
  NetThread& operator=(const NetThread&) = delete;
  boost::asio::io_context& io() { return io_; }

 private:
  boost::asio::io_context io_{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
};

}  // namespace kvrelay::worker::tcp
