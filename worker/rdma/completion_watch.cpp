#include "worker/rdma/completion_watch.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

namespace kvrelay::worker::rdma {

void CompletionWatch::start(const std::vector<int>& fds, std::function<void()> on_event) {
  on_event_ = std::move(on_event);
  for (int fd : fds) {
    const int mine = ::dup(fd);
    if (mine < 0) {
      spdlog::error("rdma: cannot watch completion channel fd {}: {}", fd, strerror(errno));
      continue;
    }
    fds_.push_back(std::make_unique<boost::asio::posix::stream_descriptor>(executor_, mine));
    wait(fds_.size() - 1);
  }
}

void CompletionWatch::wait(size_t i) {
  fds_[i]->async_wait(boost::asio::posix::stream_descriptor::wait_read,
                      [this, i, alive = alive_](const boost::system::error_code& ec) {
                        if (ec || !*alive) return;
                        on_event_();
                        if (*alive) wait(i);
                      });
}

void CompletionWatch::stop() {
  *alive_ = false;
  alive_ = std::make_shared<bool>(true);
  for (auto& d : fds_) {
    boost::system::error_code ignored;
    d->cancel(ignored);
    d->close(ignored);
  }
  fds_.clear();
}

}  // namespace kvrelay::worker::rdma
