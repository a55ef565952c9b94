#include "worker/tcp/tcp_transport.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <deque>
#include <future>
#include <optional>

#include "worker/copy_plan.h"
#include "worker/tcp/client_handshake.h"

namespace kvrelay::worker::tcp {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

void CompletionSink::push(TransferCompletion c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.push_back(std::move(c));
    any_.store(true, std::memory_order_release);
  }
  if (doorbell_ != nullptr) notify_waiters(*doorbell_);
}

void CompletionSink::take(std::vector<TransferCompletion>& out) {
  if (!any()) return;
  std::lock_guard<std::mutex> lock(mu_);
  out.insert(out.end(), std::make_move_iterator(ready_.begin()),
             std::make_move_iterator(ready_.end()));
  ready_.clear();
  any_.store(false, std::memory_order_release);
}

namespace {

// One layer of one request, as handed to a lane.
struct Job {
  TransferTicket ticket;
  std::vector<BlockRun> runs;
  uint64_t transfer = 0;
  uint64_t bytes = 0;
};

constexpr auto kMinBackoff = std::chrono::milliseconds(100);
constexpr auto kMaxBackoff = std::chrono::milliseconds(5000);

}  // namespace

class Lane;

// One decode rank's listener, seen from this rank. Its state is the network
// thread's, except the few atomics the worker's thread reads.
class Peer : public std::enable_shared_from_this<Peer> {
 public:
  Peer(asio::io_context& io, std::string host, uint16_t port, uint32_t decode_rank,
       std::string instance, const LocalPool& local, const AuthKey& key, SenderOptions options,
       std::shared_ptr<CompletionSink> sink)
      : io_(io),
        strand_(asio::make_strand(io)),
        host_(std::move(host)),
        port_(port),
        expected_instance_(std::move(instance)),
        name_(fmt::format("decode rank {} at {}:{} over tcp", decode_rank, host_, port_)),
        local_(local),
        key_(key),
        options_(std::move(options)),
        sink_(std::move(sink)) {}

  const std::string& name() const { return name_; }
  uint32_t blocks_in_layer(uint32_t layer) const {
    // Unknown until a lane has shaken hands: the receiver checks every frame.
    if (!known_.load(std::memory_order_acquire)) return UINT32_MAX;
    return layer < peer_layers_.load(std::memory_order_relaxed)
               ? peer_blocks_.load(std::memory_order_relaxed)
               : peer_extra_blocks_.load(std::memory_order_relaxed);
  }

  // On the peer's strand.
  void dispatch(Job job);
  void ensure_connected(std::function<void(Status)> done);
  void close_all(const std::string& why, const std::shared_ptr<WaitGroup>& closed);
  void fail(Job& job, const std::string& why) {
    sink_->push(TransferCompletion{job.ticket, 0, make_error(Errc::kAborted, why)});
  }
  void lane_ready(const HelloAck& ack);
  void lane_closed(bool was_ready, const std::string& why);
  asio::strand<asio::io_context::executor_type>& strand() { return strand_; }
  void completed(const Job& job, Status status) {
    sink_->push(TransferCompletion{job.ticket, status ? job.bytes : 0, std::move(status)});
  }

  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  const std::string& expected_instance() const { return expected_instance_; }
  const LocalPool& local() const { return local_; }
  const AuthKey& key() const { return key_; }
  const SenderOptions& options() const { return options_; }

 private:
  void open_lanes();
  void submit_on(Lane& lane, Job job);

  asio::io_context& io_;
  asio::strand<asio::io_context::executor_type> strand_;  // the peer's state below
  std::string host_;
  uint16_t port_;
  std::string expected_instance_;
  std::string name_;
  const LocalPool& local_;
  const AuthKey& key_;
  SenderOptions options_;
  std::shared_ptr<CompletionSink> sink_;
  std::vector<std::shared_ptr<Lane>> lanes_;
  size_t next_lane_ = 0;
  uint64_t next_transfer_ = 0;
  Clock::time_point retry_at_{};
  std::chrono::milliseconds backoff_{0};
  std::string last_error_;
  uint64_t epoch_ = 0;
  std::vector<std::function<void(Status)>> connect_waiters_;
  bool stopped_ = false;  // the transport is going: no new lanes
  std::atomic<bool> known_{false};
  // The receiver's pool shape, from its last hello: read by the worker's thread.
  std::atomic<uint32_t> peer_layers_{0};
  std::atomic<uint32_t> peer_blocks_{0};
  std::atomic<uint32_t> peer_extra_blocks_{0};
};

class Lane final : public Channel {
 public:
  // On a strand of its own: lanes move bytes in parallel.
  Lane(asio::io_context& io, Peer& peer)
      : Channel(tcp::socket(asio::make_strand(io)), peer.options().timing, peer.name()),
        peer_(peer),
        resolver_(socket_.get_executor()),
        deadline_(socket_.get_executor()) {}

  bool ready() const { return ready_.load(std::memory_order_acquire); }

  void connect() {
    auto self = std::static_pointer_cast<Lane>(shared_from_this());
    deadline_.expires_after(peer_.options().connect_timeout);
    deadline_.async_wait([self](const boost::system::error_code& ec) {
      if (!ec && !self->ready())
        self->close(fmt::format("no connection and handshake within {} ms",
                                self->peer_.options().connect_timeout.count()));
    });
    resolver_.async_resolve(
        peer_.host(), std::to_string(peer_.port()),
        [self](const boost::system::error_code& ec, tcp::resolver::results_type results) {
          if (self->closed()) return;
          if (ec) return self->close(fmt::format("cannot resolve {}: {}", self->peer_.host(),
                                                 ec.message()));
          asio::async_connect(
              self->socket_, results,
              [self](const boost::system::error_code& ec2, const tcp::endpoint&) {
                if (self->closed()) return;
                if (ec2) return self->close(fmt::format("cannot connect: {}", ec2.message()));
                tune_socket(self->socket_, self->timing_.peer_timeout);
                self->start_channel();  // the peer speaks first: its challenge
              });
        });
  }

  void submit(Job job) {
    if (closed()) return peer_.fail(job, close_reason_);  // closed after it was chosen
    if (!ready()) {
      waiting_.push_back(std::move(job));
      return;
    }
    write(std::move(job));
  }

  void on_message(Inbound in) override {
    if (!ready()) return handshake(in);
    switch (in.kind) {
      case schema::TcpEnvelope::HEARTBEAT: return read_next();
      case schema::TcpEnvelope::ACK: {
        auto it = in_flight_.find(in.ack_transfer);
        if (it != in_flight_.end()) {
          Job job = std::move(it->second);
          in_flight_.erase(it);
          peer_.completed(job, in.ack_ok ? Status{}
                                         : Status(make_error(Errc::kInvalidArgument,
                                                             fmt::format("the receiver refused "
                                                                         "it: {}",
                                                                         in.ack_reason))));
        }
        return read_next();
      }
      default:
        return close(fmt::format("unexpected message (kind {}) from the receiver",
                                 static_cast<int>(in.kind)));
    }
  }

  void on_closed(const std::string& why) override {
    resolver_.cancel();
    deadline_.cancel();
    const bool was_ready = ready();
    const std::string reason = was_ready ? fmt::format("connection lost: {}", why)
                                         : fmt::format("cannot reach it: {}", why);
    close_reason_ = reason;
    for (Job& job : waiting_)
      peer_.fail(job, reason);
    for (auto& [id, job] : in_flight_)
      peer_.fail(job, reason);
    waiting_.clear();
    in_flight_.clear();
    asio::post(peer_.strand(), [p = peer_.shared_from_this(), was_ready, why] {
      p->lane_closed(was_ready, why);
    });
  }

 private:
  void handshake(const Inbound& in) {
    if (!handshake_) {
      Hello hello;
      hello.version = kWireVersion;
      hello.instance = peer_.options().instance;
      hello.expected_instance = peer_.expected_instance();
      hello.rank = peer_.options().rank;
      hello.tp_size = peer_.options().tp_size;
      hello.pool = peer_.local().geometry();
      handshake_.emplace(peer_.key(), std::move(hello));
    }
    Outgoing out;
    Result<bool> done = handshake_->on_message(in, out.owned);
    if (!out.owned.empty()) send(std::move(out));
    if (!done) return close(done.error().message);
    if (!*done) return read_next();
    ready_.store(true, std::memory_order_release);
    deadline_.cancel();
    asio::post(peer_.strand(), [p = peer_.shared_from_this(), ack = handshake_->ack()] {
      p->lane_ready(ack);
    });
    std::deque<Job> queued = std::move(waiting_);
    waiting_.clear();
    for (Job& job : queued)
      write(std::move(job));
    read_next();
  }

  // Gather-writes every frame of a layer: envelope headers from one arena,
  // payloads straight from the pool.
  void write(Job job) {
    const LocalPool& pool = peer_.local();
    const PoolGeometry& g = pool.geometry();
    const uint32_t layer = job.ticket.layer;
    struct Piece {
      size_t header_at, header_len;
      const std::byte* payload;
      uint64_t bytes;
    };
    std::vector<Piece> pieces;
    Outgoing out;
    const uint32_t tensors = g.tensors_per_layer();
    size_t frames = 0;
    for (uint32_t t = 0; t < tensors; ++t)
      frames += job.runs.size();
    for (uint32_t t = 0; t < tensors; ++t) {
      const auto tensor = static_cast<PoolTensor>(t);
      const std::byte* base = pool.tensor(layer, tensor);
      if (base == nullptr) {
        peer_.completed(job, make_error(Errc::kInvalidArgument,
                                        fmt::format("layer {} tensor {} does not exist", layer,
                                                    t)));
        return;
      }
      to_byte_runs(job.runs, g.block_bytes(tensor), byte_runs_);
      for (const kernels::CopyRun& r : byte_runs_) {
        FrameHeader f;
        f.transfer = job.transfer;
        f.request_key = job.ticket.request_key;
        f.handle = job.ticket.handle;
        f.layer = layer;
        f.tensor = t;
        f.dst_offset = r.dst_offset;
        f.bytes = r.bytes;
        f.last = pieces.size() + 1 == frames;
        const size_t at = out.owned.size();
        encode_frame(f, out.owned);
        pieces.push_back(Piece{at, out.owned.size() - at, base + r.src_offset, r.bytes});
        job.bytes += r.bytes;
      }
    }
    out.buffers.reserve(pieces.size() * 2);
    for (const Piece& p : pieces) {
      out.buffers.emplace_back(out.owned.data() + p.header_at, p.header_len);
      out.buffers.emplace_back(p.payload, p.bytes);
    }
    const uint64_t id = job.transfer;
    in_flight_.emplace(id, std::move(job));
    send(std::move(out));
  }

  Peer& peer_;
  tcp::resolver resolver_;
  asio::steady_timer deadline_;
  std::atomic<bool> ready_{false};
  std::string close_reason_;  // what transfers handed to it after it closed are told
  std::optional<ClientHandshake> handshake_;
  std::deque<Job> waiting_;
  std::unordered_map<uint64_t, Job> in_flight_;
  std::vector<kernels::CopyRun> byte_runs_;
};

void Peer::dispatch(Job job) {
  job.transfer = ++next_transfer_;
  if (stopped_) return fail(job, "the worker's transport is stopping");
  std::erase_if(lanes_, [](const auto& l) { return l->closed(); });
  Lane* ready = nullptr;
  for (size_t i = 0; i < lanes_.size() && ready == nullptr; ++i) {
    Lane& l = *lanes_[(next_lane_ + i) % lanes_.size()];
    if (l.ready()) {
      ready = &l;
      next_lane_ = (next_lane_ + i + 1) % lanes_.size();
    }
  }
  if (ready != nullptr) {
    if (lanes_.size() < options_.lanes) open_lanes();  // replace lanes that died
    return submit_on(*ready, std::move(job));
  }
  if (lanes_.empty()) {
    const auto now = Clock::now();
    if (now < retry_at_)
      return fail(job, fmt::format("cannot reach it: {} (next attempt in {} ms)", last_error_,
                                   std::chrono::duration_cast<std::chrono::milliseconds>(
                                       retry_at_ - now)
                                       .count()));
    open_lanes();
  }
  submit_on(*lanes_[next_lane_++ % lanes_.size()], std::move(job));
}

void Peer::submit_on(Lane& lane, Job job) {
  asio::post(lane.executor(),
             [l = std::static_pointer_cast<Lane>(lane.shared_from_this()),
              job = std::move(job)]() mutable { l->submit(std::move(job)); });
}

void Peer::open_lanes() {
  while (lanes_.size() < options_.lanes) {
    auto lane = std::make_shared<Lane>(io_, *this);
    lanes_.push_back(lane);
    asio::post(lane->executor(), [lane] { lane->connect(); });
  }
}

void Peer::ensure_connected(std::function<void(Status)> done) {
  if (stopped_) return done(make_error(Errc::kAborted, "the worker's transport is stopping"));
  std::erase_if(lanes_, [](const auto& l) { return l->closed(); });
  for (const auto& l : lanes_)
    if (l->ready()) return done({});
  connect_waiters_.push_back(std::move(done));
  if (lanes_.empty()) open_lanes();  // a ConnectTask tries now, backoff or not
}

void Peer::lane_ready(const HelloAck& ack) {
  if (epoch_ != 0 && epoch_ != ack.epoch)
    spdlog::info("rank {}: {} restarted (a new pool there)", options_.rank, name_);
  epoch_ = ack.epoch;
  peer_layers_.store(ack.pool.num_layers, std::memory_order_relaxed);
  peer_blocks_.store(ack.pool.num_blocks, std::memory_order_relaxed);
  peer_extra_blocks_.store(ack.pool.extra_layer_blocks, std::memory_order_relaxed);
  known_.store(true, std::memory_order_release);
  backoff_ = std::chrono::milliseconds(0);
  retry_at_ = {};
  for (auto& w : std::exchange(connect_waiters_, {}))
    w({});
}

void Peer::lane_closed(bool was_ready, const std::string& why) {
  if (stopped_) return;  // the worker is going: nothing to say or retry
  if (was_ready) {
    spdlog::warn("rank {}: tcp lane to {} closed: {}", options_.rank, name_, why);
    return;  // the next transfer reconnects at once
  }
  last_error_ = why;
  bool any_open = false;
  for (const auto& l : lanes_)
    any_open = any_open || !l->closed();
  if (any_open) return;  // the attempt is not over yet
  backoff_ = std::clamp(backoff_ * 2, std::chrono::milliseconds(kMinBackoff),
                        std::chrono::milliseconds(kMaxBackoff));
  retry_at_ = Clock::now() + backoff_;
  spdlog::warn("rank {}: cannot reach {}: {} (retrying after {} ms)", options_.rank, name_, why,
               backoff_.count());
  for (auto& w : std::exchange(connect_waiters_, {}))
    w(make_error(Errc::kTimeout, fmt::format("cannot reach {}: {}", name_, why)));
}

void Peer::close_all(const std::string& why, const std::shared_ptr<WaitGroup>& closed) {
  stopped_ = true;
  for (auto& l : lanes_) {
    closed->add(1);
    l->close_soon(why, [closed] { closed->done(); });
  }
  lanes_.clear();
}

namespace {

class PeerDestination final : public Destination {
 public:
  explicit PeerDestination(std::shared_ptr<Peer> peer) : peer_(std::move(peer)) {}
  uint32_t blocks_in_layer(uint32_t layer) const override { return peer_->blocks_in_layer(layer); }
  const std::string& peer() const override { return peer_->name(); }
  Status submit_layer(const TransferTicket& ticket, uint32_t,
                      std::span<const BlockRun> runs) override {
    Job job;
    job.ticket = ticket;
    job.runs.assign(runs.begin(), runs.end());
    asio::post(peer_->strand(), [peer = peer_, job = std::move(job)]() mutable {
      peer->dispatch(std::move(job));
    });
    return {};
  }

 private:
  std::shared_ptr<Peer> peer_;
};

}  // namespace

TcpTransport::TcpTransport(NetThread& net, const LocalPool& local, const AuthKey* key,
                           SenderOptions options, WaitEvent* doorbell)
    : net_(net),
      local_(local),
      key_(key),
      options_(std::move(options)),
      sink_(std::make_shared<CompletionSink>(doorbell)) {}

TcpTransport::~TcpTransport() {
  // Close every lane on its strand and wait: after this no handler reads the
  // local pool. Their transfers complete with an error (unread).
  auto closed = std::make_shared<WaitGroup>();
  for (auto& [key, peer] : peers_) {
    closed->add(1);
    asio::post(peer->strand(), [p = peer, closed] {
      p->close_all("the transport is stopping", closed);
      closed->done();
    });
  }
  closed->wait();
}

Result<std::shared_ptr<Peer>> TcpTransport::peer_for(const std::string& host, uint16_t port,
                                                     uint32_t decode_rank,
                                                     const std::string& instance) {
  if (key_ == nullptr)
    return make_error(Errc::kInvalidArgument,
                      "tcp transfers need a pre-shared key: start this instance with "
                      "--auth-key-file (README: Cross-host transfer)");
  if (host.empty()) return make_error(Errc::kInvalidArgument, "tcp: the peer address is empty");
  if (port == 0) return make_error(Errc::kInvalidArgument, "tcp: port 0 is not a port");
  const std::string key = fmt::format("{}:{}/{}", host, port, instance);
  auto it = peers_.find(key);
  if (it != peers_.end()) return it->second;
  auto peer = std::make_shared<Peer>(net_.io(), host, port, decode_rank, instance, local_, *key_,
                                     options_, sink_);
  peers_.emplace(key, peer);
  return peer;
}

Result<std::shared_ptr<Destination>> TcpTransport::resolve(schema::CacheDest::Reader dest) {
  const auto ports = dest.getTcpPorts();
  const auto devices = dest.getDeviceIds();
  const uint32_t decode_rank = options_.rank < devices.size() ? devices[options_.rank]
                                                              : options_.rank;
  if (decode_rank >= ports.size())
    return make_error(Errc::kInvalidArgument,
                      fmt::format("tcpPorts has {} ports, none for decode rank {}", ports.size(),
                                  decode_rank));
  Result<std::shared_ptr<Peer>> peer = peer_for(dest.getPeerAddress().cStr(), ports[decode_rank],
                                                decode_rank, dest.getPeerInstance().cStr());
  if (!peer) return peer.error();
  return std::shared_ptr<Destination>(std::make_shared<PeerDestination>(*peer));
}

Status TcpTransport::check_connect(schema::ConnectTask::Reader connect) {
  const auto ports = connect.getPorts();
  if (options_.rank >= ports.size())
    return make_error(Errc::kInvalidArgument, fmt::format("no port for rank {}", options_.rank));
  Result<std::shared_ptr<Peer>> peer =
      peer_for(connect.getPeerAddress().cStr(), ports[options_.rank], options_.rank,
               connect.getPeerInstance().cStr());
  if (!peer) return peer.error();
  auto result = std::make_shared<std::promise<Status>>();
  std::future<Status> answer = result->get_future();
  asio::post((*peer)->strand(), [p = *peer, result] {
    p->ensure_connected([result](Status s) { result->set_value(std::move(s)); });
  });
  if (answer.wait_for(options_.connect_timeout + std::chrono::milliseconds(500)) !=
      std::future_status::ready)
    return make_error(Errc::kTimeout, fmt::format("no answer from {} within {} ms",
                                                  (*peer)->name(),
                                                  options_.connect_timeout.count()));
  return answer.get();
}

}  // namespace kvrelay::worker::tcp
