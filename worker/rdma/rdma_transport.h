// The connecting side of the rdma transport (a prefill-role worker). For each
// decode rank it sends to, a Peer holds one session: an authenticated,
// sealed control connection to the rank's listener (net/client_channel.h),
// and `queue_pairs` RC queue pairs connected to queue pairs of the receiver's
// session (rdma_receiver.h), exchanged as RdmaQpInfo, with the receiver's
// pool as RdmaMemoryRegions.
//
// A layer transfer: its intent (destination blocks) goes over the control
// connection; once granted, its writes are posted by the WritePoster (one
// RDMA WRITE per coalesced run of each tensor, the last a WRITE_WITH_IMM) on
// one queue pair, round robin; its completion comes with the receiver's ack,
// sent when that immediate has landed (every byte of the transfer is then in
// the decode pool, by RC ordering). A refused intent fails that transfer
// only, with the receiver's reason.
//
// Failure: a failed work completion, a closed or silent control connection
// (the peer died: noticed at once; a partition: after the peer timeout) end
// the session: its queue pairs are destroyed and every transfer it carried
// fails, naming the peer and the cause. The receiver must know that no byte
// of a transfer can still land before it releases what that transfer was
// granted, and destroying the whole session is how both sides know it. The
// next transfer opens a fresh session, with the tcp transport's backoff
// while the peer stays unreachable. Requests to other peers, and later
// requests to this one, are not affected.
//
// submit_layer and resolve run on the worker's thread; sessions live on the
// network thread; completions cross over through a CompletionSink.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>

#include "instance/auth_key.h"
#include "shm/wait_event.h"
#include "worker/local_pool.h"
#include "worker/net/channel.h"
#include "worker/net/completion_sink.h"
#include "worker/net/net_thread.h"
#include "worker/net/peer_plan.h"
#include "worker/rdma/fabric.h"
#include "worker/rdma/registered_pool.h"
#include "worker/transport.h"

namespace kvrelay::worker::rdma {

struct RdmaSenderOptions {
  std::string instance;  // this instance's name, for the peer's logs
  uint32_t rank = 0;
  uint32_t tp_size = 1;
  uint32_t total_kv_heads = 0;  // the model's KV heads (0: the pool's kv_heads x tp_size)
  uint32_t queue_pairs = 2;  // per decode rank, used round robin
  uint32_t signal_every = 16;
  net::Timing timing;
  net::Protection protection = net::Protection::kAuthenticate;
  std::chrono::milliseconds connect_timeout{2000};  // connect, handshake and queue pairs
};

class RdmaPeer;

class RdmaTransport final : public Transport {
 public:
  // `fabric` null: every rdma request is refused with `why_not`. `key` null:
  // refused too (the control connection must authenticate). `registered`:
  // the local pool's registration on `fabric`, made up front; null, and the
  // first request makes it.
  RdmaTransport(net::NetThread& net, const LocalPool& local, const AuthKey* key, Fabric* fabric,
                std::string why_not, RdmaSenderOptions options, WaitEvent* doorbell,
                std::shared_ptr<const RegisteredPool> registered = nullptr);
  ~RdmaTransport() override;

  const char* name() const override { return "rdma"; }
  Result<std::shared_ptr<Destination>> resolve(schema::CacheDest::Reader dest) override;
  Status check_connect(schema::ConnectTask::Reader connect) override;
  void poll(std::vector<TransferCompletion>& out) override { sink_->take(out); }
  bool has_completions() const override { return sink_->any(); }
  // Its sessions over all peers (any thread).
  const net::LinkStats& link_stats() const { return *link_stats_; }

 private:
  Status usable() const;
  Result<std::shared_ptr<RdmaPeer>> peer_for(const net::PeerAddress& at);

  net::NetThread& net_;
  const LocalPool& local_;
  const AuthKey* key_;
  Fabric* fabric_;
  std::string why_not_;
  RdmaSenderOptions options_;
  std::shared_ptr<net::CompletionSink> sink_;
  std::shared_ptr<net::LinkStats> link_stats_ = std::make_shared<net::LinkStats>();
  std::shared_ptr<const RegisteredPool> registration_;  // the local pool, once
  std::unordered_map<std::string, std::shared_ptr<RdmaPeer>> peers_;  // "host:port/instance"
};

}  // namespace kvrelay::worker::rdma
