// The connecting side of the tcp transport (a prefill-role worker): for each
// decode (address, port) it sends to, a Peer with `lanes` parallel
// connections, each authenticated and sealed (net/client_channel.h). A
// layer's transfer goes whole on one lane, round-robin: its frames are
// gather-written from the pool (no staging copy; from a GPU pool, from
// staging slots it was copied into, staging.h), and its completion comes
// when the receiver acks that its last payload is in the pool.
//
// Failure: a lane that resets (the peer died: noticed at once) or goes silent
// (a partition: heartbeats stop, noticed after the peer timeout) fails the
// transfers it carried, and only those; the scheduler fails their requests
// with the peer's name. The next transfer reconnects, with a backoff (100 ms
// doubling to 5 s) while the peer stays unreachable, during which transfers
// fail at once with the last reason.
//
// submit_layer and resolve run on the worker's thread; the lanes live on the
// network thread; completions cross over through a locked list and wake the
// worker through its doorbell.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "instance/auth_key.h"
#include "shm/wait_event.h"
#include "worker/local_pool.h"
#include "worker/net/channel.h"
#include "worker/net/completion_sink.h"
#include "worker/net/net_thread.h"
#include "worker/net/peer_plan.h"
#include "worker/tcp/staging.h"
#include "worker/transport.h"

namespace kvrelay::worker::tcp {

struct SenderOptions {
  std::string instance;  // this instance's name, for the peer's logs
  uint32_t rank = 0;
  uint32_t tp_size = 1;
  // The model's KV heads over all ranks (0: the pool's kv_heads x tp_size).
  uint32_t total_kv_heads = 0;
  uint32_t lanes = 2;
  net::Timing timing;
  net::Protection protection = net::Protection::kAuthenticate;
  std::chrono::milliseconds connect_timeout{2000};  // connect and handshake
  // A pool in GPU memory: its payloads are copied device->host through
  // staging slots here first (staging.h). None: such a pool is refused.
  std::shared_ptr<Stager> stager;
};

class Peer;

class TcpTransport final : public Transport {
 public:
  // `key` null: tcp is not configured here, and every tcp request is refused
  // saying so.
  TcpTransport(net::NetThread& net, const LocalPool& local, const AuthKey* key,
               SenderOptions options, WaitEvent* doorbell);
  ~TcpTransport() override;

  const char* name() const override { return "tcp"; }
  Result<std::shared_ptr<Destination>> resolve(schema::CacheDest::Reader dest) override;
  Status check_connect(schema::ConnectTask::Reader connect) override;
  void poll(std::vector<TransferCompletion>& out) override { sink_->take(out); }
  bool has_completions() const override { return sink_->any(); }
  // Its lanes over all peers (any thread).
  const net::LinkStats& link_stats() const { return *link_stats_; }

 private:
  Result<std::shared_ptr<Peer>> peer_for(const net::PeerAddress& at);

  net::NetThread& net_;
  const LocalPool& local_;
  const AuthKey* key_;
  SenderOptions options_;
  std::shared_ptr<net::CompletionSink> sink_;
  std::shared_ptr<net::LinkStats> link_stats_ = std::make_shared<net::LinkStats>();
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;  // "host:port/instance"
};

}  // namespace kvrelay::worker::tcp
