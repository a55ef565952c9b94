#include "worker/tcp/net_thread.h"

#include <spdlog/spdlog.h>

namespace kvrelay::worker::tcp {

NetThread::NetThread() : work_(boost::asio::make_work_guard(io_)) {
  thread_ = std::thread([this] {
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        // A handler that throws must not take the worker down with it.
        spdlog::error("network thread: {}", e.what());
      }
    }
  });
}

NetThread::~NetThread() {
  work_.reset();
  io_.stop();
  thread_.join();
}

}  // namespace kvrelay::worker::tcp
