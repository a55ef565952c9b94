#include "worker/tcp/tcp_receiver.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <deque>
#include <optional>
#include <unordered_set>

#include "worker/rdma/completion_watch.h"

namespace kvrelay::worker::tcp {

namespace asio = boost::asio;
using asio::ip::tcp;

// What every connection of the listener shares; lives as long as one of them.
struct TcpReceiver::Shared {
  Shared(asio::io_context& context, const LocalPool& p, const AuthKey& k, ReceiverOptions o,
         std::shared_ptr<ReceiverStats> s)
      : io(context),
        acceptor(asio::make_strand(context)),
        pool(p),
        key(k),
        options(std::move(o)),
        stats(std::move(s)),
        arrivals(*options.arrivals) {}
  asio::io_context& io;
  tcp::acceptor acceptor;  // on a strand of its own, with `connections` and `stopped`
  const LocalPool& pool;
  const AuthKey& key;
  ReceiverOptions options;
  std::shared_ptr<ReceiverStats> stats;
  Arrivals& arrivals;  // options.arrivals keeps it
  uint64_t epoch = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count());
  std::vector<std::weak_ptr<Channel>> connections;
  bool stopped = false;
};

namespace {

LandedWrite landed_write(const FrameHeader& f) {
  return LandedWrite{f.request_key, f.layer, f.tensor, f.dst_offset, f.bytes};
}

class Connection final : public Channel {
 public:
  Connection(tcp::socket socket, std::string peer, std::shared_ptr<TcpReceiver::Shared> shared)
      : Channel(std::move(socket), shared->options.timing, std::move(peer)),
        shared_(std::move(shared)),
        handshake_(socket_.get_executor()) {}

  void start() {
    nonce_ = random_nonce();
    Outgoing challenge;
    encode_challenge(nonce_, challenge.owned);
    send(std::move(challenge));
    handshake_.expires_after(shared_->options.handshake_timeout);
    handshake_.async_wait([self = std::static_pointer_cast<Connection>(shared_from_this())](
                              const boost::system::error_code& ec) {
      if (ec || self->state_ == State::kServing) return;
      if (self->refusing_) return self->close("refused");
      self->refuse("did not complete the handshake in time");
    });
    start_channel();
  }

 private:
  enum class State { kAwaitProof, kAwaitHello, kServing };

  // Says why (a refusing helloAck, which proves nothing), then closes once
  // it is written; the handshake timer closes it anyway if the write stalls.
  void refuse(const std::string& why) {
    if (refusing_) return;
    refusing_ = true;
    ++shared_->stats->refused;
    spdlog::warn("rank {}: tcp connection from {} refused: {}", shared_->options.rank, peer_name(),
                 why);
    HelloAck no;
    no.accepted = false;
    no.reason = why;
    no.pool = shared_->pool.geometry();
    Outgoing reply;
    encode_hello_ack(no, reply.owned);
    reply.written = [self = std::static_pointer_cast<Connection>(shared_from_this()), why] {
      self->close(why);
    };
    send(std::move(reply));
  }

  void on_message(Inbound in) override {
    if (refusing_) return;  // nothing more is read from a refused peer
    // A slow peer's heartbeat can come before its proof: the line was quiet.
    if (in.kind == schema::TcpEnvelope::HEARTBEAT) return read_next();
    switch (state_) {
      case State::kAwaitProof:
        if (in.kind != schema::TcpEnvelope::PROOF) return refuse("it sent no authentication");
        if (in.nonce.size() != kNonceBytes ||
            !shared_->key.verify(kConnectLabel, nonce_, in.nonce, in.mac))
          return refuse("authentication failed (wrong or missing key)");
        peer_nonce_ = in.nonce;
        state_ = State::kAwaitHello;
        return read_next();
      case State::kAwaitHello: {
        if (in.kind != schema::TcpEnvelope::HELLO) return refuse("it sent no hello");
        HelloAck ack;
        ack.pool = shared_->pool.geometry();
        ack.epoch = shared_->epoch;
        const Mac proof = shared_->key.mac(kAcceptLabel, peer_nonce_, nonce_);
        ack.proof.assign(proof.begin(), proof.end());
        const std::optional<HeadLayout>& heads = shared_->options.heads;
        if (heads) {
          ack.tp_size = heads->tp_size;
          ack.total_kv_heads = heads->total_heads;
        }
        Status ok =
            check_hello(in.hello, shared_->options.instance, shared_->pool.geometry(), heads);
        ack.accepted = ok.ok();
        if (!ok) ack.reason = ok.error().message;
        if (!ok) return refuse(ack.reason);
        if (shared_->options.stage_at_handshake && shared_->options.stager &&
            shared_->pool.memory_kind() != kernels::MemoryKind::kHost) {
          // Before the ack: a sender that hears it (a ConnectTask) finds them
          // made. Should it fail, the first frame is refused saying why.
          if (Status s = ensure_slots(); !s)
            spdlog::warn("rank {}: {}: no staging memory yet: {}", shared_->options.rank,
                         peer_name(), s.error().message);
        }
        Outgoing reply;
        encode_hello_ack(ack, reply.owned);
        send(std::move(reply));
        state_ = State::kServing;
        handshake_.cancel();
        ++shared_->stats->accepted;
        spdlog::info("rank {}: tcp connection from {} (instance '{}' rank {})",
                     shared_->options.rank, peer_name(), in.hello.instance, in.hello.rank);
        return read_next();
      }
      case State::kServing: break;
    }
    switch (in.kind) {
      case schema::TcpEnvelope::FRAME: return on_frame(in.frame);
      case schema::TcpEnvelope::RDMA_OFFER: return on_rdma_offer(in.rdma_offer);
      case schema::TcpEnvelope::RDMA_INTENT: return on_rdma_intent(in.rdma_intent);
      default:
        return close(fmt::format("unexpected message (kind {}) after the handshake",
                                 static_cast<int>(in.kind)));
    }
  }

  void on_frame(const FrameHeader& f) {
    auto self = std::static_pointer_cast<Connection>(shared_from_this());
    auto after = [self, f] {
      if (f.last) self->finish_transfer(f.transfer);
      self->read_next();
    };
    if (refused_.count(f.transfer) != 0) return drop(f, after);
    const bool staged = shared_->pool.memory_kind() != kernels::MemoryKind::kHost;
    Status ok = check_frame(f, shared_->pool.geometry());
    if (ok && staged) ok = ensure_slots();
    std::byte* base =
        ok ? shared_->pool.tensor(f.layer, static_cast<PoolTensor>(f.tensor)) : nullptr;
    if (ok && base == nullptr)
      ok = make_error(Errc::kInvalidArgument,
                      fmt::format("layer {} tensor {} does not exist", f.layer, f.tensor));
    if (ok) ok = shared_->arrivals.admit(landed_write(f));  // the declared requests' blocks
    if (!ok) {
      ++shared_->stats->refused_frames;
      spdlog::warn("rank {}: refused a frame from {} (transfer {}): {}", shared_->options.rank,
                   peer_name(), f.transfer, ok.error().message);
      refused_.insert(f.transfer);
      Outgoing nack;
      encode_ack(f.transfer, false, ok.error().message, nack.owned);
      send(std::move(nack));
      return drop(f, after);
    }
    ++shared_->stats->frames;
    shared_->stats->bytes += f.bytes;
    if (staged) {
      staged_.push_back(StagedFrame{f});
      return read_staged(base + f.dst_offset, f.bytes);
    }
    payload_in_progress_ = f;  // until it has landed: a close meanwhile abandons it
    read_payload(base + f.dst_offset, f.bytes, [self, f, after] {
      self->payload_in_progress_.reset();
      self->shared_->arrivals.landed(landed_write(f));
      after();
    });
  }

  // A GPU pool's connection: its staging slots, made with its first frame.
  Status ensure_slots() {
    if (slots_) return {};
    const std::shared_ptr<Stager>& stager = shared_->options.stager;
    if (!stager)
      return make_error(Errc::kUnsupported,
                        fmt::format("rank {}'s pool is {} GPU memory and its tcp listener has no "
                                    "staging for it",
                                    shared_->options.rank,
                                    kernels::memory_kind_name(shared_->pool.memory_kind())));
    Result<std::unique_ptr<StagingSlots>> slots =
        stager->make_slots(largest_block_bytes(shared_->pool.geometry()));
    if (!slots) return slots.error();
    slots_ = std::move(slots).value();
    return {};
  }

  // Reads the rest of the newest frame's payload (`left` bytes, bound for
  // `dst` in GPU memory) a slot at a time, each slot copied host->device on
  // the stager's thread; waits for a free slot when none is (the stream is
  // not read meanwhile).
  void read_staged(std::byte* dst, uint64_t left) {
    const int slot = slots_->take();
    if (slot < 0) {
      resume_ = [this, dst, left] { read_staged(dst, left); };
      return;
    }
    const uint64_t n = std::min(left, slots_->slot_bytes());
    auto self = std::static_pointer_cast<Connection>(shared_from_this());
    read_payload(slots_->slot(slot), n, [self, slot, dst, n, left] {
      StagedFrame& newest = self->staged_.back();
      ++newest.copies_in_flight;
      newest.read = n == left;
      self->shared_->options.stager->copy(
          Stager::Direction::kToDevice, {StagedCopy{self->slots_->slot(slot), dst, n}},
          [self, slot](Status copied) mutable {
            // The connection's last reference must not end on the stager's
            // thread: it may hold the stager itself.
            auto strand = self->executor();
            asio::post(strand, [self = std::move(self), slot, copied = std::move(copied)] {
              self->on_staged_copy(slot, copied);
            });
          });
      if (n < left) return self->read_staged(dst + n, left - n);
      self->read_next();
    });
  }

  // A slot's host->device copy ended. Copies end in the order they were
  // queued: it is the oldest frame's with copies in flight.
  void on_staged_copy(int slot, const Status& copied) {
    slots_->give_back(slot);
    uint64_t transfer = 0;
    for (StagedFrame& f : staged_) {
      if (f.copies_in_flight == 0) continue;
      --f.copies_in_flight;
      if (!copied) f.failed = true;
      transfer = f.header.transfer;
      break;
    }
    // Sticky (a CUDA fault): the transfer hears why, then the connection
    // closes (its other transfers fail) and nothing more lands through it.
    if (!copied && !closed() && !refusing_) {
      refusing_ = true;
      spdlog::error("rank {}: {}; closing the connection from {}", shared_->options.rank,
                    copied.error().message, peer_name());
      refused_.insert(transfer);
      Outgoing nack;
      encode_ack(transfer, false, copied.error().message, nack.owned);
      nack.written = [self = std::static_pointer_cast<Connection>(shared_from_this()),
                      why = copied.error().message] { self->close(why); };
      send(std::move(nack));
    }
    settle_staged();
    if (resume_ && !closed() && !refusing_) std::exchange(resume_, nullptr)();
  }

  // Frames whose copies have all ended count, oldest first: landed (and a
  // transfer's last one acks it), or, when a copy failed or the connection
  // closed before the payload was all read, abandoned. Never while a copy
  // of the frame may still write into the pool.
  void settle_staged() {
    while (!staged_.empty()) {
      const StagedFrame& f = staged_.front();
      if (f.copies_in_flight > 0 || (!f.read && !closed())) return;
      const FrameHeader header = f.header;
      const bool landed = f.read && !f.failed;
      staged_.pop_front();
      if (!landed) {
        shared_->arrivals.abandoned(landed_write(header));
        continue;
      }
      shared_->arrivals.landed(landed_write(header));
      if (header.last && !closed()) finish_transfer(header.transfer);
    }
  }

  void on_rdma_offer(const std::vector<rdma::QpEndpoint>& offer) {
    if (rdma_) return close("a second rdma offer on one connection");
    Outgoing reply;
    const PoolGeometry& g = shared_->pool.geometry();
    Result<std::unique_ptr<rdma::RdmaSession>> session =
        shared_->options.rdma
            ? rdma::RdmaSession::accept(*shared_->options.rdma, shared_->arrivals, offer,
                                        peer_name())
            : Result<std::unique_ptr<rdma::RdmaSession>>(make_error(
                  Errc::kInvalidArgument,
                  fmt::format("rank {} does not accept rdma (its instance was started without "
                              "rdma in --protocol)",
                              shared_->options.rank)));
    if (!session) {
      spdlog::warn("rank {}: rdma offer from {} refused: {}", shared_->options.rank, peer_name(),
                   session.error().message);
      encode_rdma_accept(false, session.error().message, {}, g, {}, reply.owned);
      send(std::move(reply));
      return read_next();
    }
    rdma_ = std::move(session).value();
    ++shared_->stats->rdma_sessions;
    const std::vector<rdma::QpEndpoint> mine = rdma_->endpoints();
    encode_rdma_accept(true, "", mine, g, rdma_->registration().tensors(), reply.owned);
    send(std::move(reply));
    spdlog::info("rank {}: rdma session with {} over {} queue pairs", shared_->options.rank,
                 peer_name(), mine.size());
    rdma_watch_.emplace(executor());
    rdma_watch_->start(rdma_->event_fds(), [this] { on_rdma_completions(); });
    on_rdma_completions();  // arms the queue pairs
    if (!closed()) read_next();
  }

  void on_rdma_intent(const RdmaIntent& part) {
    if (!rdma_) return close("an rdma intent before an rdma session");
    Result<std::optional<Status>> grant = rdma_->on_intent(part);
    if (!grant) return close(grant.error().message);
    if (*grant) {
      const Status& ok = **grant;
      if (!ok) ++shared_->stats->rdma_refused;
      Outgoing reply;
      encode_rdma_grant(part.transfer, ok.ok(), ok ? "" : ok.error().message, reply.owned);
      send(std::move(reply));
    }
    read_next();
  }

  void on_rdma_completions() {
    if (!rdma_ || closed()) return;
    acks_.clear();
    Status s = rdma_->poll(acks_);
    if (!acks_.empty()) {
      Outgoing out;
      for (const rdma::Ack& a : acks_)
        encode_ack(a.transfer, a.status.ok(), a.status ? "" : a.status.error().message, out.owned);
      shared_->stats->rdma_transfers += acks_.size();
      send(std::move(out));
    }
    if (!s) close(s.error().message);
  }

  // A refused frame's payload is read and dropped, unless it is too large
  // to be one of ours: then the stream is closed.
  void drop(const FrameHeader& f, std::function<void()> after) {
    constexpr uint64_t kMaxDrop = 1ull << 32;
    if (f.bytes > kMaxDrop)
      return close(
          fmt::format("a refused frame of {} bytes; closing rather than reading it", f.bytes));
    discard_payload(f.bytes, std::move(after));
  }

  void finish_transfer(uint64_t transfer) {
    if (refused_.erase(transfer) != 0) return;  // already answered
    Status intact = shared_->pool.check_intact();
    Outgoing ack;
    encode_ack(transfer, intact.ok(), intact ? "" : intact.error().message, ack.owned);
    send(std::move(ack));
  }

  void on_closed(const std::string& reason) override {
    handshake_.cancel();
    if (rdma_watch_) rdma_watch_->stop();
    rdma_.reset();  // its queue pairs first: then what it granted and did not land is abandoned
    if (payload_in_progress_) shared_->arrivals.abandoned(landed_write(*payload_in_progress_));
    resume_ = nullptr;
    settle_staged();  // what has no copy in flight; the rest as its copies end
    if (state_ == State::kServing) {
      spdlog::info("rank {}: tcp connection from {} closed: {}", shared_->options.rank, peer_name(),
                   reason);
    } else if (!refusing_) {  // gone (or silent) before it authenticated
      ++shared_->stats->refused;
      spdlog::warn("rank {}: tcp connection from {} refused: {}", shared_->options.rank,
                   peer_name(), reason);
    }
  }

  std::shared_ptr<TcpReceiver::Shared> shared_;
  asio::steady_timer handshake_;
  State state_ = State::kAwaitProof;
  bool refusing_ = false;
  Nonce nonce_{};
  std::vector<uint8_t> peer_nonce_;
  std::unordered_set<uint64_t> refused_;            // transfers refused, until their last frame
  std::optional<FrameHeader> payload_in_progress_;  // admitted, its payload being read
  // A GPU pool's: admitted frames not yet settled, oldest first.
  struct StagedFrame {
    FrameHeader header;
    uint32_t copies_in_flight = 0;
    bool read = false;    // all of its payload is in slots or on the device
    bool failed = false;  // a copy of it failed
  };
  std::deque<StagedFrame> staged_;
  std::unique_ptr<StagingSlots> slots_;
  std::function<void()> resume_;                    // the read that waits for a free slot
  std::unique_ptr<rdma::RdmaSession> rdma_;         // once the peer offered one
  std::optional<rdma::CompletionWatch> rdma_watch_;
  std::vector<rdma::Ack> acks_;  // scratch
};

void accept_next(const std::shared_ptr<TcpReceiver::Shared>& shared) {
  // Each connection gets a strand of its own: lanes run in parallel.
  shared->acceptor.async_accept(
      asio::make_strand(shared->io),
      [shared](const boost::system::error_code& ec, tcp::socket socket) {
        if (shared->stopped) return;
        if (!ec) {
          boost::system::error_code ignored;
          const auto remote = socket.remote_endpoint(ignored);
          tune_socket(socket, shared->options.timing.peer_timeout);
          auto c = std::make_shared<Connection>(
              std::move(socket), fmt::format("{}:{}", remote.address().to_string(), remote.port()),
              shared);
          std::erase_if(shared->connections, [](const auto& w) { return w.expired(); });
          shared->connections.push_back(c);
          asio::dispatch(c->executor(), [c] { c->start(); });
        } else if (ec == asio::error::operation_aborted) {
          return;
        } else {
          spdlog::warn("rank {}: accept failed: {}", shared->options.rank, ec.message());
        }
        accept_next(shared);
      });
}

}  // namespace

Result<std::unique_ptr<TcpReceiver>> TcpReceiver::start(NetThread& net, const LocalPool& pool,
                                                        const AuthKey& key,
                                                        ReceiverOptions options) {
  auto stats = std::make_shared<ReceiverStats>();
  if (!options.arrivals) options.arrivals = std::make_shared<Arrivals>(pool.geometry(), nullptr);
  auto shared = std::make_shared<Shared>(net.io(), pool, key, options, stats);
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(options.address, ec);
  if (ec)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("--listen-address '{}' is not an IP address", options.address));
  const tcp::endpoint endpoint(address, options.port);
  auto& a = shared->acceptor;
  if (a.open(endpoint.protocol(), ec); !ec) a.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return make_error(Errc::kSystem, fmt::format("cannot listen on {}:{} for tcp transfers: {}",
                                                 options.address, options.port, ec.message()));
  const uint16_t port = a.local_endpoint(ec).port();
  asio::post(shared->acceptor.get_executor(), [shared] { accept_next(shared); });
  std::unique_ptr<TcpReceiver> r(new TcpReceiver(std::move(shared), port));
  r->stats_ = std::move(stats);
  spdlog::info("rank {}: accepting tcp transfers on {}:{}", options.rank, options.address, port);
  return r;
}

TcpReceiver::TcpReceiver(std::shared_ptr<Shared> shared, uint16_t port)
    : shared_(std::move(shared)), port_(port) {}

TcpReceiver::~TcpReceiver() {
  // Stop accepting and close every connection, each on its strand, and wait:
  // after this no handler writes into the pool.
  auto closed = std::make_shared<WaitGroup>();
  closed->add(1);
  asio::post(shared_->acceptor.get_executor(), [shared = shared_, closed] {
    shared->stopped = true;
    boost::system::error_code ignored;
    shared->acceptor.close(ignored);
    for (auto& w : shared->connections) {
      if (auto c = w.lock()) {
        closed->add(1);
        c->close_soon("the receiver is stopping", [closed] { closed->done(); });
      }
    }
    closed->done();
  });
  closed->wait();
  // Copies into a GPU pool that were queued before the connections closed.
  if (shared_->options.stager) shared_->options.stager->drain();
}

}  // namespace kvrelay::worker::tcp
