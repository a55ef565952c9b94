// What a sending worker knows of one decode rank's listener, for either
// network transport (tcp lanes, rdma sessions): the shape of its pool from
// the last handshake, which the worker's thread reads for range checks; its
// epoch, to notice a restart; and the backoff while it cannot be reached
// (100 ms doubling to 5 s, during which transfers fail at once with the last
// reason). Also the ConnectTask waiters. Everything but blocks_in_layer()
// runs on the owning peer's strand.
#pragma once

#include <algorithm>
#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shm/result.h"
#include "worker/net/hello.h"
#include "worker/net/net_thread.h"

namespace kvrelay::worker::net {

// What a sending transport's connections did, over all its peers: read by
// the worker's thread into its counters block (kvrelay-dump shows them).
struct LinkStats {
  std::atomic<uint64_t> opened{0};       // handshakes accepted
  std::atomic<uint64_t> lost{0};         // connections that had served, closed
  std::atomic<uint64_t> unreachable{0};  // attempts that reached no one
};

class PeerLink {
 public:
  // `stats`: the transport's, shared by its peers.
  PeerLink(std::string name, uint32_t rank, const char* connection,
           std::shared_ptr<LinkStats> stats)
      : name_(std::move(name)), rank_(rank), connection_(connection), stats_(std::move(stats)) {}

  // "decode rank 1 at 198.18.0.2:7100 over rdma", for messages.
  const std::string& name() const { return name_; }
  // Any thread. UINT32_MAX until a handshake told: the receiver checks anyway.
  uint32_t blocks_in_layer(uint32_t layer) const;

  // Why a transfer must fail now, while a reconnect waits out its backoff.
  std::optional<std::string> backing_off() const;
  // A connection was accepted: its pool's shape and epoch; the backoff ends
  // and ConnectTask waiters hear ok.
  void connected(const HelloAck& ack);
  // An attempt to reach it failed: the backoff grows and waiters hear why.
  void unreachable(const std::string& why);
  // A connection that had served closed (logged; the next transfer reconnects at once).
  void lost(const std::string& why) const;
  // A ConnectTask's answer, once the next attempt ends.
  void on_next_attempt(std::function<void(Status)> done) { waiters_.push_back(std::move(done)); }
  // The transport is going: every waiter hears it.
  void stop();

 private:
  using Clock = std::chrono::steady_clock;
  std::string name_;
  uint32_t rank_;
  const char* connection_;  // "tcp lane", "rdma session"
  std::shared_ptr<LinkStats> stats_;
  Clock::time_point retry_at_{};
  std::chrono::milliseconds backoff_{0};
  std::string last_error_;
  uint64_t epoch_ = 0;
  std::vector<std::function<void(Status)>> waiters_;
  std::atomic<bool> known_{false};
  std::atomic<uint32_t> layers_{0};
  std::atomic<uint32_t> blocks_{0};
  std::atomic<uint32_t> extra_blocks_{0};
};

// Runs `ensure(done)` on `strand` and waits up to `timeout` for `done`: a
// ConnectTask's answer, for the worker's thread.
Status await_connected(boost::asio::any_io_executor strand,
                       std::function<void(std::function<void(Status)>)> ensure,
                       const std::string& name, std::chrono::milliseconds timeout);

}  // namespace kvrelay::worker::net
