#include "worker/receiver.h"

namespace kvrelay::worker {

Result<std::unique_ptr<Receiver>> Receiver::start(net::NetThread& net, const LocalPool& pool,
                                                  const AuthKey& key, ReceiverOptions o) {
  std::unique_ptr<Receiver> r(new Receiver());
  if (!o.arrivals) o.arrivals = std::make_shared<Arrivals>(pool.geometry(), nullptr);
  r->stager_ = o.stager;
  net::ListenerOptions lo;
  lo.address = o.address;
  lo.port = o.port;
  lo.instance = o.instance;
  lo.rank = o.rank;
  lo.pool = pool.geometry();
  lo.heads = o.heads;
  lo.timing = o.timing;
  lo.protection = o.protection;
  lo.handshake_timeout = o.handshake_timeout;
  tcp::FrameReceiverOptions fo;
  fo.rank = o.rank;
  fo.pool = &pool;
  fo.arrivals = o.arrivals;
  fo.stager = o.stager;
  fo.payload_grace = o.timing.peer_timeout;
  if (o.frames) lo.handlers.push_back(tcp::frame_receiver(fo, r->frames_, o.stage_at_handshake));
  lo.handlers.push_back(rdma::session_handler(o.rdma,
                                              "rank does not accept rdma (no rdma listener here)",
                                              o.arrivals, o.rank, r->sessions_));
  Result<std::unique_ptr<net::Listener>> l = net::Listener::start(net, key, lo);
  if (!l) return l.error();
  r->listener_ = std::move(l).value();
  return r;
}

Receiver::~Receiver() {
  listener_.reset();
  if (stager_) stager_->drain();
}

}  // namespace kvrelay::worker
