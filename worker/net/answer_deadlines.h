// The answers a connection waits for from its peer (a grant, an ack), each
// with a deadline, looked at every `every` on the connection's strand. The
// first one overdue is handed to its owner, which closes the connection: a
// peer that takes bytes or requests and never answers costs that
// connection, never the worker (and a withdrawal waiting on it is
// confirmed). Not thread-safe: the connection's strand owns it.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <unordered_map>

namespace kvrelay::worker::net {

class AnswerDeadlines {
 public:
  struct Due {
    std::chrono::steady_clock::time_point at;
    const char* what;  // "ack", "grant": for the owner's message
    std::chrono::milliseconds within;
  };

  AnswerDeadlines(const boost::asio::any_io_executor& executor, std::chrono::milliseconds every)
      : timer_(executor), every_(every) {}

  // Answer `what` to `id` is due within `within`. `owner` (a member's
  // owner, kept alive while anything is watched) hears of the first one
  // overdue through owner->answer_overdue(id, due), unless owner->closed().
  template <class Owner>
  void expect(uint64_t id, const char* what, std::chrono::milliseconds within,
              std::shared_ptr<Owner> owner) {
    due_[id] = Due{std::chrono::steady_clock::now() + within, what, within};
    if (!watching_) watch(std::move(owner));
  }
  void answered(uint64_t id) { due_.erase(id); }
  void clear() {
    due_.clear();
    timer_.cancel();
  }

 private:
  template <class Owner>
  void watch(std::shared_ptr<Owner> owner) {
    watching_ = true;
    timer_.expires_after(every_);
    timer_.async_wait([this, owner](const boost::system::error_code& ec) {
      watching_ = false;
      if (ec || owner->closed() || due_.empty()) return;
      const auto now = std::chrono::steady_clock::now();
      for (const auto& [id, due] : due_)
        if (now > due.at) return owner->answer_overdue(id, due);
      watch(owner);
    });
  }

  std::unordered_map<uint64_t, Due> due_;
  boost::asio::steady_timer timer_;
  std::chrono::milliseconds every_;
  bool watching_ = false;
};

}  // namespace kvrelay::worker::net
