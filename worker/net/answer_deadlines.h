// The answers a connection waits for from its peer (a grant, an ack), looked
// at every `every` on the connection's strand. A peer answers in order, so
// only the oldest answer still awaited is judged, and its clock starts when
// it was asked for or when the peer last answered anything, whichever is
// later: a peer that keeps answering is never cut, however long the queue
// in front of an answer is and however slowly its link runs (a contended
// host, a long prompt's backlog), and one that stops answering is cut
// `within` after its last answer. The answer overdue is handed to its owner,
// which closes the connection: a peer that takes bytes or requests and never
// answers costs that connection, never the worker (and a withdrawal waiting
// on it is confirmed). Not thread-safe: the connection's strand owns it.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <unordered_map>

namespace kvrelay::worker::net {

class AnswerDeadlines {
 public:
  struct Due {
    std::chrono::steady_clock::time_point asked;
    const char* what;  // "ack", "grant": for the owner's message
    std::chrono::milliseconds within;  // of the later of `asked` and the peer's last answer
  };

  AnswerDeadlines(const boost::asio::any_io_executor& executor, std::chrono::milliseconds every)
      : timer_(executor), every_(every) {}

  // Answer `what` to `id` is asked for now (`at`: for tests), due within
  // `within`. `owner` (a member's owner, kept alive while anything is
  // watched) hears of the one overdue through owner->answer_overdue(id,
  // due), unless owner->closed().
  template <class Owner>
  void expect(uint64_t id, const char* what, std::chrono::milliseconds within,
              std::shared_ptr<Owner> owner,
              std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now()) {
    due_[id] = Due{at, what, within};
    if (!watching_) watch(std::move(owner));
  }
  void answered(uint64_t id,
                std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now()) {
    if (due_.erase(id) != 0) last_answer_ = std::max(last_answer_, at);
  }
  void clear() {
    due_.clear();
    timer_.cancel();
  }
  // The answer overdue at `now`, if any: the oldest one awaited, when more
  // than its `within` has passed since it was asked for or since the peer's
  // last answer, whichever is later.
  std::optional<std::pair<uint64_t, Due>> overdue_at(std::chrono::steady_clock::time_point now) const {
    if (due_.empty()) return std::nullopt;
    auto oldest = due_.begin();
    for (auto it = due_.begin(); it != due_.end(); ++it)
      if (it->second.asked < oldest->second.asked) oldest = it;
    const Due& due = oldest->second;
    if (now - std::max(due.asked, last_answer_) <= due.within) return std::nullopt;
    return std::make_pair(oldest->first, due);
  }

 private:
  template <class Owner>
  void watch(std::shared_ptr<Owner> owner) {
    watching_ = true;
    timer_.expires_after(every_);
    timer_.async_wait([this, owner](const boost::system::error_code& ec) {
      watching_ = false;
      if (ec || owner->closed() || due_.empty()) return;
      if (auto overdue = overdue_at(std::chrono::steady_clock::now()))
        return owner->answer_overdue(overdue->first, overdue->second);
      watch(owner);
    });
  }

  std::unordered_map<uint64_t, Due> due_;
  std::chrono::steady_clock::time_point last_answer_{};
  boost::asio::steady_timer timer_;
  std::chrono::milliseconds every_;
  bool watching_ = false;
};

}  // namespace kvrelay::worker::net
