#include "worker/rdma/rdma_transport.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <algorithm>
#include <deque>
#include <optional>

#include "worker/copy_plan.h"
#include "worker/net/answer_deadlines.h"
#include "worker/net/client_channel.h"
#include "worker/rdma/completion_watch.h"
#include "worker/rdma/control_wire.h"
#include "worker/rdma/grant_windows.h"
#include "worker/rdma/rdma_receiver.h"
#include "worker/rdma/write_poster.h"

namespace kvrelay::worker::rdma {

namespace asio = boost::asio;


namespace {

using Job = net::LayerJob;

// A work request's length is 32 bits; longer runs are split.
constexpr uint64_t kMaxWriteBytes = 1ull << 30;

}  // namespace

class Session;

// One decode rank's listener, seen from this rank: its state is on its
// strand, except the few atomics the worker's thread reads.
class RdmaPeer : public std::enable_shared_from_this<RdmaPeer> {
 public:
  RdmaPeer(asio::io_context& io, std::string host, uint16_t port, uint32_t decode_rank,
           std::string instance, const LocalPool& local,
           std::shared_ptr<const RegisteredPool> registration, const AuthKey& key, Fabric& fabric,
           RdmaSenderOptions options, std::shared_ptr<net::CompletionSink> sink,
           std::shared_ptr<net::LinkStats> stats)
      : io_(io),
        strand_(asio::make_strand(io)),
        host_(std::move(host)),
        port_(port),
        expected_instance_(std::move(instance)),
        link_(fmt::format("decode rank {} at {}:{} over rdma", decode_rank, host_, port_),
              options.rank, "rdma session", std::move(stats)),
        local_(local),
        registration_(std::move(registration)),
        key_(key),
        fabric_(fabric),
        options_(std::move(options)),
        sink_(std::move(sink)) {}

  const std::string& name() const { return link_.name(); }
  const net::PeerLink& link() const { return link_; }

  // On the peer's strand.
  void dispatch(Job job);
  void ensure_connected(std::function<void(Status)> done);
  void close_all(const std::string& why, const std::shared_ptr<net::WaitGroup>& closed);
  void session_ready(const net::HelloAck& ack);
  void session_closed(bool was_ready, const std::string& why);
  asio::strand<asio::io_context::executor_type>& strand() { return strand_; }

  // From any strand.
  void fail(const Job& job, const std::string& why) {
    sink_->push(TransferCompletion{job.ticket, 0, make_error(Errc::kAborted, why)});
  }
  void completed(const Job& job, Status status) {
    sink_->push(TransferCompletion{job.ticket, status ? job.bytes : 0, std::move(status)});
  }

  asio::io_context& io() { return io_; }
  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  const std::string& expected_instance() const { return expected_instance_; }
  const LocalPool& local() const { return local_; }
  const RegisteredPool& registration() const { return *registration_; }
  const AuthKey& key() const { return key_; }
  Fabric& fabric() const { return fabric_; }
  const RdmaSenderOptions& options() const { return options_; }

 private:
  void open_session();
  void submit_on(Job job);

  asio::io_context& io_;
  asio::strand<asio::io_context::executor_type> strand_;
  std::string host_;
  uint16_t port_;
  std::string expected_instance_;
  net::PeerLink link_;
  const LocalPool& local_;
  std::shared_ptr<const RegisteredPool> registration_;
  const AuthKey& key_;
  Fabric& fabric_;
  RdmaSenderOptions options_;
  std::shared_ptr<net::CompletionSink> sink_;
  std::shared_ptr<Session> session_;
  bool stopped_ = false;
};

// The control connection and queue pairs of one session, on a strand of
// their own (the socket's).
class Session final : public net::ClientChannel {
  // A transfer's grant as it comes in.
  struct GrantedKeys {
    size_t queue_pair = 0;        // the intent's
    std::vector<uint32_t> rkeys;  // the grant's parts so far
  };

 public:
  Session(asio::io_context& io, RdmaPeer& peer)
      : ClientChannel(io, peer.options().timing, peer.name(), peer.key(), peer.options().protection,
                      net::make_hello(peer.options().instance, peer.expected_instance(),
                                      peer.options().rank, peer.options().tp_size,
                                      peer.local().geometry(), peer.options().total_kv_heads),
                      net::ClientTarget{peer.host(), peer.port(), peer.options().connect_timeout,
                                        "connection, handshake and queue pairs"}),
        peer_(peer),
        watch_(socket_.get_executor()),
        answers_(socket_.get_executor(), peer.options().timing.heartbeat) {}

  void submit(Job job) {
    if (closed()) return peer_.fail(job, close_reason_);
    if (!ready()) {
      waiting_.push_back(std::move(job));
      return;
    }
    start(std::move(job));
  }

  void on_serving(net::Inbound in) override {
    if (in.kind == schema::NetEnvelope::HEARTBEAT) return read_next();
    if (in.kind != schema::NetEnvelope::MESSAGE || in.protocol != kProtocol)
      return close(
          fmt::format("unexpected message (kind {}) from the receiver", static_cast<int>(in.kind)));
    Result<Message> m = decode(in);
    if (!m) return close(m.error().message);
    if (!ready()) {
      if (m->kind != Message::Kind::kAccept)
        return close("the receiver did not answer the rdma offer");
      return on_accept(m->accept);
    }
    switch (m->kind) {
      case Message::Kind::kGrant: on_grant(m->grant); break;
      case Message::Kind::kAck: on_ack(m->answer.transfer, m->answer.ok, m->answer.reason); break;
      default: return close("an rdma message only a sender sends, sent to a sender");
    }
    if (!closed()) read_next();
  }

  void on_closed(const std::string& raw) override {
    const std::string why = describe_close(raw);
    stop_connecting();
    watch_.stop();
    const bool was_ready = ready();
    const std::string reason = was_ready ? fmt::format("rdma session lost: {}", why)
                                         : fmt::format("cannot reach it: {}", why);
    close_reason_ = reason;
    // Nothing of this session may read the pool after this: its queue pairs go.
    poster_.reset();
    queue_pairs_.clear();
    for (Job& job : waiting_)
      peer_.fail(job, reason);
    for (auto& [id, job] : in_flight_)
      peer_.fail(job, reason);
    waiting_.clear();
    in_flight_.clear();
    granting_.clear();
    answers_.clear();
    asio::post(peer_.strand(), [p = peer_.shared_from_this(), was_ready, why] {
      p->session_closed(was_ready, why);
    });
  }

 private:
  void on_accepted() override { offer(); }

  // Our queue pairs, for the receiver to connect its own to.
  void offer() {
    std::vector<QpEndpoint> mine;
    for (uint32_t i = 0; i < std::max(1U, peer_.options().queue_pairs); ++i) {
      Result<std::unique_ptr<RcQueuePair>> qp = peer_.fabric().create_queue_pair();
      if (!qp) return close(fmt::format("no queue pair on {}: {}", peer_.fabric().name(),
                                        qp.error().message));
      mine.push_back((*qp)->local());
      queue_pairs_.push_back(std::move(qp).value());
    }
    net::Outgoing out;
    encode_offer(mine, out.owned);
    send(std::move(out));
    read_next();
  }

  void on_accept(const Accept& a) {
    if (!a.accepted) return close(fmt::format("the receiver refused rdma: {}", a.reason));
    if (a.queue_pairs.size() != queue_pairs_.size())
      return close(fmt::format("the receiver answered {} queue pairs for the {} offered",
                               a.queue_pairs.size(), queue_pairs_.size()));
    const PoolGeometry& remote_pool = ack().pool;
    Result<RemoteTensors> remote = check_regions(a.regions, remote_pool);
    if (!remote) return close(remote.error().message);
    remote_ = std::move(remote).value();
    std::vector<QueuePair*> lanes;
    std::vector<int> fds;
    for (size_t i = 0; i < queue_pairs_.size(); ++i) {
      if (Status s = queue_pairs_[i]->connect(a.queue_pairs[i]); !s)
        return close(s.error().message);
      lanes.push_back(queue_pairs_[i].get());
      fds.push_back(queue_pairs_[i]->event_fd());
    }
    poster_.emplace(std::move(lanes), peer_.options().signal_every);
    watch_.start(fds, [this] { on_completions(); });
    on_completions();  // arms them
    if (closed()) return;
    mark_ready();
    asio::post(peer_.strand(), [p = peer_.shared_from_this(), a = ack()] { p->session_ready(a); });
    std::deque<Job> queued = std::move(waiting_);
    waiting_.clear();
    for (Job& job : queued)
      start(std::move(job));
    if (!closed()) read_next();
  }

  // Asks for the layer's destination blocks; its writes wait for the grant.
  void start(Job job) {
    if (closed()) return peer_.fail(job, close_reason_);  // an earlier start's send failed
    if (std::optional<std::string> why = net::layout_refusal(job, ack()))
      return peer_.fail(job, *why);
    const std::optional<size_t> queue_pair = poster_->next_queue_pair();
    if (!queue_pair) return peer_.fail(job, "every queue pair to this peer has failed");
    job.transfer = ++next_transfer_;
    Intent intent;
    intent.transfer = job.transfer;
    intent.request_key = job.ticket.request_key;
    intent.handle = job.ticket.handle;
    intent.layer = job.ticket.layer;
    intent.queue_pair = static_cast<uint32_t>(*queue_pair);
    if (job.share) {
      intent.first_head = job.share->dst_head;
      intent.heads = job.share->heads;
    }
    net::Outgoing out;
    for (size_t i = 0; i < job.runs.size() || i == 0; i += kMaxIntentRuns) {
      intent.runs.clear();
      for (size_t k = i; k < std::min(job.runs.size(), i + kMaxIntentRuns); ++k)
        intent.runs.push_back({job.runs[k].dst_block, job.runs[k].count});
      intent.last = i + kMaxIntentRuns >= job.runs.size();
      encode_intent(intent, out.owned);
    }
    // In flight before it is sent: a send that fails closes the session at
    // once, and the close fails what is in flight.
    const uint64_t id = job.transfer;
    in_flight_.emplace(id, std::move(job));
    granting_.emplace(id, GrantedKeys{*queue_pair, {}});
    expect_answer(id, "grant", peer_.options().timing.peer_timeout);
    send(std::move(out));
  }

  // A receiver that never grants, or never acks writes that landed
  // (net/answer_deadlines.h).
  void expect_answer(uint64_t id, const char* what, std::chrono::milliseconds within) {
    answers_.expect(id, what, within, std::static_pointer_cast<Session>(shared_from_this()));
  }

 public:
  void answer_overdue(uint64_t id, const net::AnswerDeadlines::Due& due) {
    auto job = in_flight_.find(id);
    close(fmt::format("no {} for layer {} (transfer {}) within {} ms", due.what,
                      job != in_flight_.end() ? job->second.ticket.layer : 0, id,
                      due.within.count()));
  }

 private:
  // The grant comes in parts, a key per run and tensor; the writes go once
  // the last is in.
  void on_grant(const Grant& grant) {
    auto it = in_flight_.find(grant.transfer);
    auto keys = granting_.find(grant.transfer);
    if (it == in_flight_.end() || keys == granting_.end())
      return close(
          fmt::format("a grant for transfer {}, which is not waiting for one", grant.transfer));
    if (!grant.ok) {
      answers_.answered(grant.transfer);
      peer_.completed(it->second,
                      make_error(Errc::kInvalidArgument,
                                 fmt::format("the receiver refused it: {}", grant.reason)));
      in_flight_.erase(it);
      granting_.erase(keys);
      return;
    }
    const uint32_t tensors = peer_.local().geometry().tensors_per_layer();
    const size_t expected = it->second.runs.size() * tensors;
    std::vector<uint32_t>& rkeys = keys->second.rkeys;
    const size_t held = rkeys.size() + grant.rkeys.size();
    if (held > expected || (grant.last && held != expected))
      return close(fmt::format("the grant for transfer {} holds {} keys{}, not one per run and "
                               "tensor ({} runs, {} tensors)",
                               grant.transfer, held, grant.last ? "" : " so far",
                               it->second.runs.size(), tensors));
    rkeys.insert(rkeys.end(), grant.rkeys.begin(), grant.rkeys.end());
    if (!grant.last) return;
    answers_.answered(grant.transfer);
    GrantedKeys granted = std::move(keys->second);
    granting_.erase(keys);
    post_writes(it->second, granted);
  }

  // One write per coalesced run of each tensor, split where a run is longer
  // than a work request may be, each with the key granted for its run.
  void post_writes(Job& job, const GrantedKeys& keys) {
    const PoolGeometry& g = peer_.local().geometry();
    const RegisteredPool& reg = peer_.registration();
    const uint32_t layer = job.ticket.layer;
    LayerWrite lw;
    lw.transfer = job.transfer;
    lw.immediate = immediate_of(job.transfer);
    lw.queue_pair = keys.queue_pair;
    // Tensors by their slot in a layer: both sides' pools are of one kind
    // (checked at the hello), so the slots are the same tensors.
    for (uint32_t t = 0; t < g.tensors_per_layer(); ++t) {
      const PoolTensor tensor = g.tensor_at(t);
      const uint64_t head = g.block_bytes(tensor) / g.kv_heads;
      const uint64_t dst_block_bytes =
          job.share ? head * ack().pool.kv_heads : g.block_bytes(tensor);
      if (job.share)  // heterogeneous TP: one write per block's head range
        to_head_runs(job.runs, g.block_bytes(tensor), dst_block_bytes, head, *job.share,
                     byte_runs_);
      else
        to_byte_runs(job.runs, g.block_bytes(tensor), byte_runs_);
      GrantedRunKeys run_keys(job.runs, keys.rkeys, t, g.tensors_per_layer(), dst_block_bytes);
      for (const kernels::CopyRun& r : byte_runs_) {
        for (uint64_t done = 0; done < r.bytes; done += kMaxWriteBytes) {
          const uint64_t len = std::min(kMaxWriteBytes, r.bytes - done);
          Result<uint64_t> remote = remote_->address(layer, t, r.dst_offset + done, len);
          if (!remote) return close(fmt::format("layer {}: {}", layer, remote.error().message));
          const std::optional<uint32_t> rkey = run_keys.next(r.dst_offset + done, len);
          if (!rkey)
            return close(fmt::format("the grant for transfer {} holds no key for bytes {}..{} "
                                     "of layer {}'s tensor {}",
                                     job.transfer, r.dst_offset + done,
                                     r.dst_offset + done + len - 1, layer, t));
          WriteRequest w;
          w.local_address = reg.address(layer, t) + r.src_offset + done;
          w.length = static_cast<uint32_t>(len);
          w.lkey = reg.lkey(layer, t);
          w.remote_address = *remote;
          w.rkey = *rkey;
          lw.writes.push_back(w);
        }
        job.bytes += r.bytes;
      }
    }
    poster_->submit(std::move(lw));
    // Its writes go after every transfer posted before it: its clock runs
    // from the peer's last answer (net/answer_deadlines.h), and allows its
    // own bytes at the slowest rate either side accepts.
    expect_answer(job.transfer, "ack",
                  peer_.options().timing.peer_timeout +
                      std::chrono::milliseconds(job.bytes * 1000 / kMinRateBytesPerSecond));
    drain();
  }

  void on_ack(uint64_t transfer, bool ok, const std::string& reason) {
    answers_.answered(transfer);
    auto it = in_flight_.find(transfer);
    if (it == in_flight_.end()) return;  // failed here already
    peer_.completed(it->second, ok ? Status{}
                                   : Status(make_error(Errc::kInvalidArgument,
                                                       fmt::format("the receiver refused it: {}",
                                                                   reason))));
    in_flight_.erase(it);
  }

  void on_completions() {
    if (closed() || !poster_) return;
    for (auto& qp : queue_pairs_)
      if (Status s = qp->arm(); !s) return close(s.error().message);
    drain();
  }

  // Reaps send completions and posts what waited for room. A failed one ends
  // the session (see the header).
  void drain() {
    done_.clear();
    poster_->progress(done_);
    for (const TransferDone& d : done_)
      if (!d.status) return close(d.status.error().message);
  }

  RdmaPeer& peer_;
  CompletionWatch watch_;
  std::string close_reason_;
  std::vector<std::unique_ptr<RcQueuePair>> queue_pairs_;
  std::optional<WritePoster> poster_;
  std::optional<RemoteTensors> remote_;
  uint64_t next_transfer_ = 0;
  std::deque<Job> waiting_;
  std::unordered_map<uint64_t, Job> in_flight_;  // asked for, granted or posted
  std::unordered_map<uint64_t, GrantedKeys> granting_;  // asked for, not granted yet
  net::AnswerDeadlines answers_;                 // the answer each in-flight transfer waits for
  std::vector<kernels::CopyRun> byte_runs_;
  std::vector<TransferDone> done_;
};

void RdmaPeer::dispatch(Job job) {
  if (stopped_) return fail(job, "the worker's transport is stopping");
  if (session_ && session_->closed()) session_.reset();
  if (!session_) {
    if (std::optional<std::string> why = link_.backing_off()) return fail(job, *why);
    open_session();
  }
  submit_on(std::move(job));
}

void RdmaPeer::submit_on(Job job) {
  asio::post(session_->executor(), [s = session_, job = std::move(job)]() mutable {
    s->submit(std::move(job));
  });
}

void RdmaPeer::open_session() {
  session_ = std::make_shared<Session>(io_, *this);
  asio::post(session_->executor(), [s = session_] { s->connect(); });
}

void RdmaPeer::ensure_connected(std::function<void(Status)> done) {
  if (stopped_) return done(make_error(Errc::kAborted, "the worker's transport is stopping"));
  if (session_ && session_->closed()) session_.reset();
  if (session_ && session_->ready()) return done({});
  link_.on_next_attempt(std::move(done));
  if (!session_) open_session();  // a ConnectTask tries now, backoff or not
}

void RdmaPeer::session_ready(const net::HelloAck& ack) {
  link_.connected(ack);
  spdlog::info("rank {}: rdma session with {} ready", options_.rank, name());
}

void RdmaPeer::session_closed(bool was_ready, const std::string& why) {
  if (stopped_) return;
  if (was_ready) return link_.lost(why);  // the next transfer opens a fresh one at once
  link_.unreachable(why);
}

void RdmaPeer::close_all(const std::string& why, const std::shared_ptr<net::WaitGroup>& closed) {
  stopped_ = true;
  link_.stop();
  if (session_) {
    closed->add(1);
    session_->close_soon(why, [closed] { closed->done(); });
  }
  session_.reset();
}

RdmaTransport::RdmaTransport(net::NetThread& net, const LocalPool& local, const AuthKey* key,
                             Fabric* fabric, std::string why_not, RdmaSenderOptions options,
                             WaitEvent* doorbell, std::shared_ptr<const RegisteredPool> registered)
    : net_(net),
      local_(local),
      key_(key),
      fabric_(fabric),
      why_not_(std::move(why_not)),
      options_(std::move(options)),
      sink_(std::make_shared<net::CompletionSink>(doorbell)),
      registration_(std::move(registered)) {}

RdmaTransport::~RdmaTransport() {
  // After this nothing reads the local pool or touches the fabric. Their
  // transfers complete with an error.
  net::close_peers(peers_);
}

Status RdmaTransport::usable() const {
  if (fabric_ == nullptr) return make_error(Errc::kInvalidArgument, why_not_);
  if (key_ == nullptr)
    return make_error(
        Errc::kInvalidArgument,
        "rdma transfers need a pre-shared key for their control connection: start "
        "this instance with --auth-key-file (docs/transports.md: Cross-host transfer)");
  return {};
}

Result<std::shared_ptr<RdmaPeer>> RdmaTransport::peer_for(const net::PeerAddress& at) {
  if (Status s = usable(); !s) return s.error();
  if (at.host.empty())
    return make_error(Errc::kInvalidArgument, "rdma: the peer address is empty");
  if (at.port == 0) return make_error(Errc::kInvalidArgument, "rdma: port 0 is not a port");
  if (!registration_) {
    Result<std::unique_ptr<RegisteredPool>> r = RegisteredPool::create(*fabric_, local_);
    if (!r) return r.error();
    registration_ = std::move(r).value();
  }
  auto it = peers_.find(at.key());
  if (it != peers_.end()) return it->second;
  auto peer =
      std::make_shared<RdmaPeer>(net_.io(), at.host, at.port, at.decode_rank, at.instance, local_,
                                 registration_, *key_, *fabric_, options_, sink_, link_stats_);
  peers_.emplace(at.key(), peer);
  return peer;
}

Result<std::shared_ptr<Destination>> RdmaTransport::resolve(schema::CacheDest::Reader dest) {
  if (Status s = usable(); !s) return s.error();
  const HeadLayout mine =
      net::sender_heads(local_.geometry(), options_.tp_size, options_.total_kv_heads);
  Result<net::PeerPlan> plan =
      net::plan_peers(dest, dest.getRdmaPorts(), "rdmaPorts", options_.rank, mine);
  if (!plan) return plan.error();
  return net::plan_destination<RdmaPeer>(
      *plan, [this](const net::PeerAddress& at) { return peer_for(at); },
      dest.getPeerAddress().cStr(), mine, "rdma");
}

Status RdmaTransport::check_connect(schema::ConnectTask::Reader connect) {
  Result<std::vector<net::PeerAddress>> all = net::connect_addresses(
      connect, options_.rank,
      net::sender_heads(local_.geometry(), options_.tp_size, options_.total_kv_heads));
  if (!all) return all.error();
  return net::connect_all<RdmaPeer>(
      *all, [this](const net::PeerAddress& at) { return peer_for(at); }, options_.connect_timeout);
}

}  // namespace kvrelay::worker::rdma
