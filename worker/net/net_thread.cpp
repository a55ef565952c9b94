#include "worker/net/net_thread.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace kvrelay::worker::net {

NetThread::NetThread(unsigned threads)
    : io_(static_cast<int>(std::max(1u, threads))), work_(boost::asio::make_work_guard(io_)) {
  // spdlog's registry is made on first use; make it here, before the
  // threads that log, rather than in a race between them and the caller
  // (which ThreadSanitizer reports: libspdlog's own guard is not visible
  // to it).
  (void)spdlog::default_logger_raw();
  for (unsigned i = 0; i < std::max(1u, threads); ++i) {
    threads_.emplace_back([this] {
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
}

NetThread::~NetThread() {
  work_.reset();
  io_.stop();
  for (std::thread& t : threads_)
    t.join();
}

}  // namespace kvrelay::worker::net
