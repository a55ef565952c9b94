// How a sending rank's requests map onto the decode ranks' listeners, for
// every network transport: which decode rank (and, with heterogeneous TP,
// which heads) each layer goes to, the Destination the scheduler hands
// layers to (one part per decode rank, each handed to its peer's strand),
// and the ConnectTask's wait. A transport brings its own Peer class, with
// strand(), link(), dispatch(LayerJob), ensure_connected() and close_all().
#pragma once

#include <algorithm>
#include <boost/asio/post.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "instance/head_layout.h"
#include "schemas/kvrelay.capnp.h"
#include "shm/result.h"
#include "worker/copy_plan.h"
#include "worker/net/hello.h"
#include "worker/net/net_thread.h"
#include "worker/net/peer_link.h"
#include "worker/transport.h"

namespace kvrelay::worker::net {

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
// Every decode rank rank `rank` sends to, for a ConnectTask: the same rank,
// or (ports for another TP size: heterogeneous TP) those the head split names.
Result<std::vector<PeerAddress>> connect_addresses(schema::ConnectTask::Reader connect,
                                                   uint32_t rank, const HeadLayout& mine);

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
  // Heterogeneous TP: only these heads of each block go (to a decode rank
  // of another TP size).
  std::optional<HeadShare> share;
  // The decode instance's layout the job was planned for: a connection
  // whose receiver says otherwise fails it rather than write wrong heads
  // (tp_size 0: not checked).
  HeadLayout decode_layout{0, 0, 0};
  uint64_t transfer = 0;  // the connection's id for it
  uint64_t bytes = 0;     // what it moves
};

// Why a job must not go over a connection whose receiver answered `ack`, or
// nothing: the receiver's layout is not the one the job was planned for.
std::optional<std::string> layout_refusal(const LayerJob& job, const HelloAck& ack);

// The Destination of a request over a network transport: one peer, or
// (heterogeneous TP) one part per decode rank its heads go to, each with
// its head range. submit_layer hands the layer to each part's strand
// (Peer::dispatch), which owns everything else; it cannot fail, so each
// part's completion follows.
template <class Peer>
class PeerDestination final : public Destination {
 public:
  struct Part {
    std::shared_ptr<Peer> peer;
    std::optional<HeadShare> share;
  };
  PeerDestination(std::vector<Part> parts, HeadLayout decode_layout, std::string name)
      : parts_(std::move(parts)), decode_layout_(decode_layout), name_(std::move(name)) {}
  explicit PeerDestination(std::shared_ptr<Peer> peer, HeadLayout decode_layout = {0, 0, 0})
      : PeerDestination({Part{peer, std::nullopt}}, decode_layout, peer->link().name()) {}
  uint32_t blocks_in_layer(uint32_t layer) const override {
    // No parts: a replica whose heads other ranks send (it writes nothing).
    uint32_t blocks = UINT32_MAX;
    for (const Part& p : parts_)
      blocks = std::min(blocks, p.peer->link().blocks_in_layer(layer));
    return blocks;
  }
  const std::string& peer() const override { return name_; }
  uint32_t transfers_per_submit() const override { return static_cast<uint32_t>(parts_.size()); }
  Status submit_layer(const TransferTicket& ticket, uint32_t,
                      std::span<const BlockRun> runs) override {
    for (const Part& p : parts_) {
      LayerJob job;
      job.ticket = ticket;
      job.runs.assign(runs.begin(), runs.end());
      job.share = p.share;
      job.decode_layout = decode_layout_;
      boost::asio::post(p.peer->strand(), [peer = p.peer, job = std::move(job)]() mutable {
        peer->dispatch(std::move(job));
      });
    }
    return {};
  }

 private:
  std::vector<Part> parts_;
  HeadLayout decode_layout_;
  std::string name_;
};

// A network transport's plan for one request of rank `rank`: the decode
// ranks its heads go to. `ports` (one per decode rank, as CacheDest names
// them) says the decode instance's TP size: the same as `mine`, and the
// rank sends all of its heads to one decode rank (deviceIds, else its own);
// another, and the head split decides (heterogeneous TP).
struct PeerPlan {
  struct Target {
    PeerAddress address;
    std::optional<HeadShare> share;
  };
  std::vector<Target> targets;
  HeadLayout decode_layout;
};
Result<PeerPlan> plan_peers(schema::CacheDest::Reader dest, capnp::List<uint16_t>::Reader ports,
                            const char* ports_field, uint32_t rank, const HeadLayout& mine);

// A sending rank's layout: its pool's heads, its instance's TP size and the
// model's KV heads (0: the pool's heads x tp_size).
HeadLayout sender_heads(const PoolGeometry& pool, uint32_t tp_size, uint32_t total_kv_heads);

// The Destination of a plan: a part per target, its peer from
// `peer_for(PeerAddress) -> Result<std::shared_ptr<Peer>>`. `over`: "tcp",
// "rdma", for the name of a split destination.
template <class Peer, class PeerFor>
Result<std::shared_ptr<Destination>> plan_destination(const PeerPlan& plan, PeerFor&& peer_for,
                                                      const std::string& address,
                                                      const HeadLayout& mine, const char* over) {
  std::vector<typename PeerDestination<Peer>::Part> parts;
  std::string ranks;
  for (const PeerPlan::Target& t : plan.targets) {
    Result<std::shared_ptr<Peer>> peer = peer_for(t.address);
    if (!peer) return peer.error();
    parts.push_back({std::move(peer).value(), t.share});
    ranks += (ranks.empty() ? "" : ",") + std::to_string(t.address.decode_rank);
  }
  std::string name = parts.size() == 1 && !parts[0].share
                         ? parts[0].peer->link().name()
                         : "decode ranks " + (ranks.empty() ? std::string("none") : ranks) +
                               " at " + address + " over " + over + " (tp " +
                               std::to_string(mine.tp_size) + " -> tp " +
                               std::to_string(plan.decode_layout.tp_size) + ")";
  return std::shared_ptr<Destination>(std::make_shared<PeerDestination<Peer>>(
      std::move(parts), plan.decode_layout, std::move(name)));
}

// A ConnectTask's answer: every address connected within `timeout` each,
// or the first that did not.
template <class Peer, class PeerFor>
Status connect_all(const std::vector<PeerAddress>& addresses, PeerFor&& peer_for,
                   std::chrono::milliseconds timeout) {
  for (const PeerAddress& at : addresses) {
    Result<std::shared_ptr<Peer>> peer = peer_for(at);
    if (!peer) return peer.error();
    std::shared_ptr<Peer> p = *peer;
    if (Status s = await_connected(
            p->strand(),
            [p](std::function<void(Status)> done) { p->ensure_connected(std::move(done)); },
            p->link().name(), timeout);
        !s)
      return s;
  }
  return {};
}

}  // namespace kvrelay::worker::net
