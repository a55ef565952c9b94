// The threads that run a worker's network I/O (tcp listener and tcp lanes):
// one Boost.Asio io_context driven by `threads` threads, so that lanes move
// bytes in parallel (one thread per lane, by default). Each connection, and
// each peer, lives on a strand of its own: its state is touched by one
// handler at a time, whichever thread runs it. The worker's loop hands work
// over with asio::post and learns of results through the transport's
// completions.
#pragma once

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace kvrelay::worker::net {

// Counts work handed to other strands (closes, mostly); wait() returns once
// every piece has said done().
class WaitGroup {
 public:
  void add(int n = 1) {
    std::lock_guard<std::mutex> lock(mu_);
    n_ += n;
  }
  void done() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--n_ == 0) cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return n_ <= 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_ = 0;
};

class NetThread {
 public:
  explicit NetThread(unsigned threads = 2);
  ~NetThread();  // stops the loop and joins: handlers never run after this
  NetThread(const NetThread&) = delete;
  NetThread& operator=(const NetThread&) = delete;
  boost::asio::io_context& io() { return io_; }

 private:
  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::vector<std::thread> threads_;
};

}  // namespace kvrelay::worker::net
