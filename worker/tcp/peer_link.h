// What a sending worker knows of one decode rank's listener, for either
// network transport (tcp lanes, rdma sessions): the shape of its pool from
// the last handshake, which the worker's thread reads for range checks; its
// epoch, to notice a restart; and the backoff while it cannot be reached
// (100 ms doubling to 5 s, during which transfers fail at once with the last
// reason). Also the ConnectTask waiters. Everything but blocks_in_layer()
// runs on the owning peer's strand.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>
#include <memory>
#include <span>

#include "shm/result.h"
#include "worker/copy_plan.h"
#include "worker/tcp/net_thread.h"
#include "worker/tcp/wire.h"
#include "worker/transport.h"

namespace kvrelay::worker::tcp {

class PeerLink {
 public:
  PeerLink(std::string name, uint32_t rank, const char* connection)
      : name_(std::move(name)), rank_(rank), connection_(connection) {}

  // "decode rank 1 at 10.0.0.2:7100 over rdma", for messages.
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

// Which decode rank's listener a rank sends to, and where it is.
struct PeerAddress {
  std::string host;
  uint16_t port = 0;
  uint32_t decode_rank = 0;
  std::string instance;  // the decode instance it means to reach ("" any)
  std::string key() const { return host + ":" + std::to_string(port) + "/" + instance; }
};

// Where rank `rank`'s blocks of a request go: the decode rank its deviceIds
// entry names (the same rank without one) and that rank's port in `ports`
// (the field `ports_field`, for the message).
Result<PeerAddress> destination_address(schema::CacheDest::Reader dest,
                                        capnp::List<uint16_t>::Reader ports,
                                        const char* ports_field, uint32_t rank);
// The same rank of the peer, for a ConnectTask.
Result<PeerAddress> connect_address(schema::ConnectTask::Reader connect, uint32_t rank);

// Closes every peer of a transport (Peer::close_all on its strand) and waits
// until none can touch the local pool any more.
template <class PeerMap>
void close_peers(PeerMap& peers) {
  auto closed = std::make_shared<WaitGroup>();
  for (auto& [key, peer] : peers) {
    closed->add(1);
    boost::asio::post(peer->strand(), [p = peer, closed] {
      p->close_all("the transport is stopping", closed);
      closed->done();
    });
  }
  closed->wait();
}

// One layer of one request, as the worker hands it to a peer.
struct LayerJob {
  TransferTicket ticket;
  std::vector<BlockRun> runs;
  uint64_t transfer = 0;  // the connection's id for it
  uint64_t bytes = 0;     // what it moves
};

// The Destination of a request to one peer: submit_layer hands the layer to
// the peer's strand (Peer::dispatch), which owns everything else.
template <class Peer>
class PeerDestination final : public Destination {
 public:
  explicit PeerDestination(std::shared_ptr<Peer> peer) : peer_(std::move(peer)) {}
  uint32_t blocks_in_layer(uint32_t layer) const override {
    return peer_->link().blocks_in_layer(layer);
  }
  const std::string& peer() const override { return peer_->link().name(); }
  Status submit_layer(const TransferTicket& ticket, uint32_t,
                      std::span<const BlockRun> runs) override {
    LayerJob job;
    job.ticket = ticket;
    job.runs.assign(runs.begin(), runs.end());
    boost::asio::post(peer_->strand(), [peer = peer_, job = std::move(job)]() mutable {
      peer->dispatch(std::move(job));
    });
    return {};
  }

 private:
  std::shared_ptr<Peer> peer_;
};

}  // namespace kvrelay::worker::tcp
