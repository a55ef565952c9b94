#include "worker/tcp/tcp_transport.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <deque>
#include <optional>

#include "worker/copy_plan.h"
#include "worker/net/answer_deadlines.h"
#include "worker/net/client_channel.h"
#include "worker/tcp/frame_plan.h"
#include "worker/tcp/frame_wire.h"

namespace kvrelay::worker::tcp {

namespace asio = boost::asio;

namespace {

using Job = net::LayerJob;
using net::HelloAck;
using net::Inbound;
using net::Outgoing;
using net::WaitGroup;

}  // namespace

class Lane;

// One decode rank's listener, seen from this rank. Its state is the network
// thread's, except the few atomics the worker's thread reads.
class Peer : public std::enable_shared_from_this<Peer> {
 public:
  Peer(asio::io_context& io, std::string host, uint16_t port, uint32_t decode_rank,
       std::string instance, const LocalPool& local, const AuthKey& key, SenderOptions options,
       std::shared_ptr<net::CompletionSink> sink, std::shared_ptr<net::LinkStats> stats)
      : io_(io),
        strand_(asio::make_strand(io)),
        host_(std::move(host)),
        port_(port),
        expected_instance_(std::move(instance)),
        link_(fmt::format("decode rank {} at {}:{} over tcp", decode_rank, host_, port_),
              options.rank, "tcp lane", std::move(stats)),
        local_(local),
        key_(key),
        options_(std::move(options)),
        sink_(std::move(sink)) {}

  const std::string& name() const { return link_.name(); }
  const net::PeerLink& link() const { return link_; }

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
  net::PeerLink link_;
  const LocalPool& local_;
  const AuthKey& key_;
  SenderOptions options_;
  std::shared_ptr<net::CompletionSink> sink_;
  std::vector<std::shared_ptr<Lane>> lanes_;
  size_t next_lane_ = 0;
  uint64_t next_transfer_ = 0;
  bool stopped_ = false;  // the transport is going: no new lanes
};

class Lane final : public net::ClientChannel {
 public:
  Lane(asio::io_context& io, Peer& peer)
      : ClientChannel(io, peer.options().timing, peer.name(), peer.key(), peer.options().protection,
                      net::make_hello(peer.options().instance, peer.expected_instance(),
                                      peer.options().rank, peer.options().tp_size,
                                      peer.local().geometry(), peer.options().total_kv_heads),
                      net::ClientTarget{peer.host(), peer.port(), peer.options().connect_timeout}),
        peer_(peer),
        acks_(executor(), peer.options().timing.heartbeat) {}

  void submit(Job job) {
    if (closed()) return peer_.fail(job, close_reason_);  // closed after it was chosen
    if (!ready()) {
      waiting_.push_back(std::move(job));
      return;
    }
    write(std::move(job));
  }

  void on_serving(Inbound in) override {
    if (in.kind == schema::NetEnvelope::HEARTBEAT) return read_next();
    if (in.kind != schema::NetEnvelope::MESSAGE || in.protocol != kProtocol)
      return close(
          fmt::format("unexpected message (kind {}) from the receiver", static_cast<int>(in.kind)));
    Result<Message> m = decode(in);
    if (!m) return close(m.error().message);
    if (m->kind != Message::Kind::kAck) return close("a tcp frame sent to a sender");
    acks_.answered(m->ack.transfer);
    auto it = in_flight_.find(m->ack.transfer);
    if (it != in_flight_.end()) {
      Job job = std::move(it->second);
      in_flight_.erase(it);
      peer_.completed(
          job, m->ack.ok
                   ? Status{}
                   : Status(make_error(Errc::kInvalidArgument,
                                       fmt::format("the receiver refused it: {}", m->ack.reason))));
    }
    return read_next();
  }

  void on_closed(const std::string& raw) override {
    const std::string why = describe_close(raw);
    stop_connecting();
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
    acks_.clear();
    asio::post(peer_.strand(), [p = peer_.shared_from_this(), was_ready, why] {
      p->lane_closed(was_ready, why);
    });
  }

 private:
  void on_accepted() override {
    mark_ready();
    if (peer_.local().memory_kind() != kernels::MemoryKind::kHost && peer_.options().stager) {
      // Now rather than with the first job, which should not wait for it.
      // Should it fail, that job fails saying why.
      if (Status s = ensure_slots(); !s)
        spdlog::warn("rank {}: {}: no staging memory yet: {}", peer_.options().rank, peer_.name(),
                     s.error().message);
    }
    asio::post(peer_.strand(), [p = peer_.shared_from_this(), a = ack()] { p->lane_ready(a); });
    std::deque<Job> queued = std::move(waiting_);
    waiting_.clear();
    for (Job& job : queued)
      write(std::move(job));
    read_next();
  }

  // Gather-writes every frame of a layer: envelope headers from one arena,
  // payloads straight from the pool.
  void write(Job job) {
    if (std::optional<std::string> why = net::layout_refusal(job, ack()))
      return peer_.completed(job, make_error(Errc::kLayoutMismatch, *why));
    const LocalPool& pool = peer_.local();
    const PoolGeometry& g = pool.geometry();
    const uint32_t layer = job.ticket.layer;
    for (uint32_t slot = 0; slot < g.tensors_per_layer(); ++slot) {
      if (pool.tensor(layer, g.tensor_at(slot)) == nullptr)
        return peer_.completed(
            job, make_error(Errc::kInvalidArgument,
                            fmt::format("layer {} tensor {} does not exist", layer,
                                        tensor_name(g.tensor_at(slot)))));
    }
    plan_frames(job, g, ack().pool.kv_heads, byte_runs_, frames_);
    if (pool.memory_kind() != kernels::MemoryKind::kHost) return write_staged(std::move(job));
    // Scattered blocks go as frames of many runs: one envelope and one tag
    // for up to kGroupRuns blocks, each gathered straight from the pool.
    Outgoing out;
    out.payloads.reserve(frames_.size());
    job.bytes += append_frames(
        frames_,
        [&](size_t i) {
          const PlannedFrame& f = frames_[i];
          return pool.tensor(layer, static_cast<PoolTensor>(f.header.tensor)) + f.src_offset;
        },
        out);
    const uint64_t id = job.transfer;
    in_flight_.emplace(id, std::move(job));
    out.written = [self = std::static_pointer_cast<Lane>(shared_from_this()), id] {
      self->sent(id);
    };
    send(std::move(out));
  }

  // Every byte of transfer `id` is with the kernel: its ack must follow
  // within the peer timeout (net/answer_deadlines.h).
  void sent(uint64_t id) {
    if (in_flight_.count(id) == 0) return;  // answered already (a refusal)
    acks_.expect(id, "ack", peer_.options().timing.peer_timeout,
                 std::static_pointer_cast<Lane>(shared_from_this()));
  }

 public:
  // A receiver that takes the bytes and never acks (stuck, or hostile).
  void answer_overdue(uint64_t id, const net::AnswerDeadlines::Due& due) {
    auto job = in_flight_.find(id);
    close(fmt::format("no {} for layer {} (transfer {}) within {} ms after its last byte was sent",
                      due.what, job != in_flight_.end() ? job->second.ticket.layer : 0, id,
                      due.within.count()));
  }

 private:
  // A GPU pool's staging slots, made once.
  Status ensure_slots() {
    if (slots_) return {};
    const LocalPool& pool = peer_.local();
    const std::shared_ptr<Stager>& stager = peer_.options().stager;
    if (!stager)
      return make_error(Errc::kUnsupported,
                        fmt::format("the pool is {} GPU memory and this tcp transport has no "
                                    "staging for it",
                                    kernels::memory_kind_name(pool.memory_kind())));
    Result<std::unique_ptr<StagingSlots>> slots =
        stager->make_slots(largest_block_bytes(pool.geometry()));
    if (!slots) return slots.error();
    slots_ = std::move(slots).value();
    return {};
  }

  // A GPU pool's job: its frames, split to fit a staging slot, queue for
  // stage_next().
  void write_staged(Job job) {
    const LocalPool& pool = peer_.local();
    if (Status s = ensure_slots(); !s) return peer_.completed(job, std::move(s));
    for (const PlannedFrame& f : frames_) {
      job.bytes += f.header.bytes;
      split_to_fit(f, pool.geometry(), slots_->slot_bytes(), staged_frames_);
    }
    in_flight_.emplace(job.transfer, std::move(job));
    stage_next();
  }

  // While a slot is free: fills it with the next frames' payloads
  // (device->host on the stager's thread), then sends them from there; the
  // slot is free again once they are written. Batches end in queue order,
  // so frames go out in order.
  void stage_next() {
    const LocalPool& pool = peer_.local();
    while (!staged_frames_.empty() && !closed()) {
      const int slot = slots_->take();
      if (slot < 0) return;  // written() calls again
      std::byte* const base = slots_->slot(slot);
      uint64_t used = 0;
      std::vector<StagedCopy> copies;
      std::vector<uint64_t> ends;  // transfers whose last frame is in this batch
      std::vector<PlannedFrame> in_slot;
      while (!staged_frames_.empty() &&
             staged_frames_.front().header.bytes <= slots_->slot_bytes() - used) {
        const PlannedFrame f = staged_frames_.front();
        staged_frames_.pop_front();
        if (f.header.last) ends.push_back(f.header.transfer);
        copies.push_back(StagedCopy{
            pool.tensor(f.header.layer, static_cast<PoolTensor>(f.header.tensor)) + f.src_offset,
            base + used, f.header.bytes});
        in_slot.push_back(f);
        used += f.header.bytes;
      }
      // Sent from the slot, grouped as from a host pool.
      Outgoing out;
      (void)append_frames(
          in_slot, [&](size_t i) { return copies[i].dst; }, out);
      if (copies.empty()) {  // cannot be: a slot holds the largest block (split_to_fit)
        slots_->give_back(slot);
        return close(fmt::format("a frame of {} bytes does not fit a staging slot of {}",
                                 staged_frames_.front().header.bytes, slots_->slot_bytes()));
      }
      auto self = std::static_pointer_cast<Lane>(shared_from_this());
      out.written = [self, slot, ends = std::move(ends)] {
        for (uint64_t id : ends)
          self->sent(id);
        self->slots_->give_back(slot);
        self->stage_next();
      };
      // The lane's last reference ends on its strand, never on the stager's
      // thread: the callback hands its own over.
      auto staged = [self, out = std::move(out)](Status copied) mutable {
        auto strand = self->executor();
        asio::post(strand, [self = std::move(self), copied = std::move(copied),
                            out = std::move(out)]() mutable {
          self->send_staged(std::move(copied), std::move(out));
        });
      };
      peer_.options().stager->copy(Stager::Direction::kToHost, std::move(copies),
                                   std::move(staged));
    }
  }

  // A batch's device->host copy ended: its frames go, or (a CUDA fault,
  // sticky) the lane closes and its transfers fail with the reason.
  void send_staged(Status copied, Outgoing out) {
    if (closed()) return;
    if (!copied) return close(copied.error().message);
    send(std::move(out));
  }

  Peer& peer_;
  std::unique_ptr<StagingSlots> slots_;     // a GPU pool's, from its first job
  std::deque<PlannedFrame> staged_frames_;  // waiting for a slot, in order
  std::string close_reason_;  // what transfers handed to it after it closed are told
  std::deque<Job> waiting_;
  std::unordered_map<uint64_t, Job> in_flight_;
  // Transfers all of whose bytes were handed to the kernel, since when.
  net::AnswerDeadlines acks_;  // of transfers whose last byte was sent
  std::vector<kernels::CopyRun> byte_runs_;
  std::vector<PlannedFrame> frames_;  // write()'s plan of one job, reused
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
    if (std::optional<std::string> why = link_.backing_off()) return fail(job, *why);
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
  link_.on_next_attempt(std::move(done));
  if (lanes_.empty()) open_lanes();  // a ConnectTask tries now, backoff or not
}

void Peer::lane_ready(const HelloAck& ack) { link_.connected(ack); }

void Peer::lane_closed(bool was_ready, const std::string& why) {
  if (stopped_) return;  // the worker is going: nothing to say or retry
  if (was_ready) return link_.lost(why);  // the next transfer reconnects at once
  for (const auto& l : lanes_)
    if (!l->closed()) return;  // the attempt is not over yet
  link_.unreachable(why);
}

void Peer::close_all(const std::string& why, const std::shared_ptr<net::WaitGroup>& closed) {
  stopped_ = true;
  link_.stop();
  for (auto& l : lanes_) {
    closed->add(1);
    l->close_soon(why, [closed] { closed->done(); });
  }
  lanes_.clear();
}

TcpTransport::TcpTransport(net::NetThread& net, const LocalPool& local, const AuthKey* key,
                           SenderOptions options, WaitEvent* doorbell)
    : net_(net),
      local_(local),
      key_(key),
      options_(std::move(options)),
      sink_(std::make_shared<net::CompletionSink>(doorbell)) {}

TcpTransport::~TcpTransport() {
  // After this no handler reads the local pool, and no staged copy either.
  // Their transfers complete with an error (unread).
  net::close_peers(peers_);
  if (options_.stager) options_.stager->drain();
}

Result<std::shared_ptr<Peer>> TcpTransport::peer_for(const net::PeerAddress& at) {
  if (key_ == nullptr)
    return make_error(Errc::kInvalidArgument,
                      "tcp transfers need a pre-shared key: start this instance with "
                      "--auth-key-file (docs/transports.md: Cross-host transfer)");
  if (at.host.empty()) return make_error(Errc::kInvalidArgument, "tcp: the peer address is empty");
  if (at.port == 0) return make_error(Errc::kInvalidArgument, "tcp: port 0 is not a port");
  auto it = peers_.find(at.key());
  if (it != peers_.end()) return it->second;
  auto peer = std::make_shared<Peer>(net_.io(), at.host, at.port, at.decode_rank, at.instance,
                                     local_, *key_, options_, sink_, link_stats_);
  peers_.emplace(at.key(), peer);
  return peer;
}

Result<std::shared_ptr<Destination>> TcpTransport::resolve(schema::CacheDest::Reader dest) {
  const HeadLayout mine =
      net::sender_heads(local_.geometry(), options_.tp_size, options_.total_kv_heads);
  Result<net::PeerPlan> plan =
      net::plan_peers(dest, dest.getTcpPorts(), "tcpPorts", options_.rank, mine);
  if (!plan) return plan.error();
  return net::plan_destination<Peer>(
      *plan, [this](const net::PeerAddress& at) { return peer_for(at); },
      dest.getPeerAddress().cStr(), mine, "tcp");
}

Status TcpTransport::check_connect(schema::ConnectTask::Reader connect) {
  Result<std::vector<net::PeerAddress>> all = net::connect_addresses(
      connect, options_.rank,
      net::sender_heads(local_.geometry(), options_.tp_size, options_.total_kv_heads));
  if (!all) return all.error();
  return net::connect_all<Peer>(
      *all, [this](const net::PeerAddress& at) { return peer_for(at); }, options_.connect_timeout);
}

}  // namespace kvrelay::worker::tcp
