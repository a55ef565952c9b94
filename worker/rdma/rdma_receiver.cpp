#include "worker/rdma/rdma_receiver.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>

namespace kvrelay::worker::rdma {

namespace {

// Receives kept posted on each queue pair: one is consumed by each transfer
// (its last write's immediate), and the sender has no more transfers on a
// queue pair than its send queue holds.
constexpr uint32_t kReceivesPerQueuePair = 256;
// Transfers asked for and not yet landed, per session: more than the
// sender's send queues could carry means it is not a kvrelay sender.
constexpr size_t kMaxOpenTransfers = 16 * 4096;
// What the open transfers of a session may hold admitted at once (each
// admitted write is kept until it lands): bounds a session's memory by what
// it asks for, not by how many transfers it opens.
constexpr size_t kMaxOpenWrites = size_t{1} << 20;

Error broken(std::string message) {
  return make_error(Errc::kInvalidArgument, std::move(message));
}

}  // namespace

Result<std::shared_ptr<const RegisteredPool>> RdmaListener::registration() {
  std::lock_guard<std::mutex> lock(mu_);
  if (registration_) return registration_;
  Result<std::unique_ptr<RegisteredPool>> r = RegisteredPool::create(*fabric_, pool_);
  if (!r) return r.error();
  registration_ = std::move(r).value();
  spdlog::info("rank {}: pool {} registered on {} for rdma ({} registrations)", rank_,
               pool_.name(), fabric_->name(), registration_->registrations());
  return registration_;
}

Result<std::unique_ptr<RdmaSession>> RdmaSession::accept(RdmaListener& listener, Arrivals& arrivals,
                                                         std::span<const QpEndpoint> offer,
                                                         std::string peer, std::string sender) {
  if (listener.fabric() == nullptr)
    return make_error(Errc::kInvalidArgument, listener.why_not());
  std::unique_ptr<RdmaSession> s(new RdmaSession(listener, arrivals, std::move(peer)));
  s->sender_ = std::move(sender);
  Result<std::shared_ptr<const RegisteredPool>> reg = listener.registration();
  if (!reg) return reg.error();
  s->registration_ = std::move(reg).value();
  for (const QpEndpoint& remote : offer) {
    Result<std::unique_ptr<RcQueuePair>> qp = listener.fabric()->create_queue_pair();
    if (!qp) return qp.error();
    for (uint32_t i = 0; i < kReceivesPerQueuePair; ++i)
      if (Status st = (*qp)->post_receive(i); !st) return st.error();
    if (Status st = (*qp)->connect(remote); !st) return st.error();
    s->queue_pairs_.push_back(std::move(qp).value());
    if (s->registration_->windows())
      s->window_work_.push_back(std::make_unique<WindowWork>(*s->queue_pairs_.back()));
  }
  return s;
}

RdmaSession::~RdmaSession() {
  // No byte may land after a write is abandoned: the queue pairs go first
  // (their windows with them), and the work that names them before that.
  window_work_.clear();
  queue_pairs_.clear();
  for (auto& [imm, g] : transfers_)
    abandon(g);
}

std::vector<QpEndpoint> RdmaSession::endpoints() const {
  std::vector<QpEndpoint> out;
  for (const auto& qp : queue_pairs_)
    out.push_back(qp->local());
  return out;
}

std::vector<int> RdmaSession::event_fds() const {
  std::vector<int> out;
  for (const auto& qp : queue_pairs_)
    out.push_back(qp->event_fd());
  return out;
}

void RdmaSession::admit(Granted& g, const LandedWrite& w) {
  if (open_writes_ >= kMaxOpenWrites) {
    g.refused = fmt::format(
        "the session holds {} admitted writes of transfers whose writes "
        "have not landed; no more until some do",
        open_writes_);
    return;
  }
  if (Status ok = arrivals_.admit(w); !ok) {
    g.refused = ok.error().message;
    return;
  }
  g.writes.push_back(w);
  g.bytes += w.bytes;
  ++open_writes_;
}

void RdmaSession::abandon(Granted& g) {
  for (const LandedWrite& w : g.writes)
    arrivals_.abandoned(w);
  open_writes_ -= g.writes.size();
  g.writes.clear();
}

std::vector<Grant> RdmaSession::grant_keys(const Granted& g) const {
  const uint32_t tensors = listener_.pool().geometry().tensors_per_layer();
  const std::vector<RemoteTensor>& registered = registration_->tensors();
  // The window group of each run: group i holds runs [i*n/G, (i+1)*n/G), as
  // window_spans() bound them.
  const size_t total_runs = g.run_spans.size();
  const size_t groups = std::min(total_runs, RdmaSession::kWindowGroups);
  std::vector<uint32_t> group_of(g.windows.empty() ? 0 : total_runs);
  for (size_t i = 0; i < groups && !g.windows.empty(); ++i)
    for (size_t r = i * total_runs / groups; r < (i + 1) * total_runs / groups; ++r)
      group_of[r] = static_cast<uint32_t>(i);
  std::vector<Grant> parts;
  size_t run = 0;  // over the whole intent
  for (const size_t runs : g.part_runs) {
    Grant& part = parts.emplace_back();
    part.transfer = g.transfer;
    part.ok = true;
    part.last = false;
    part.rkeys.reserve(runs * tensors);
    for (size_t r = 0; r < runs; ++r, ++run) {
      const size_t group = g.windows.empty() ? 0 : group_of[run];
      for (uint32_t slot = 0; slot < tensors; ++slot)
        part.rkeys.push_back(g.windows.empty()
                                 ? registered[size_t{g.layer} * tensors + slot].rkey
                                 : g.windows[group * tensors + slot]->rkey());
    }
  }
  parts.back().last = true;
  return parts;
}

std::vector<WindowWork::Bind> RdmaSession::window_spans(const Granted& g) const {
  const PoolGeometry& geometry = listener_.pool().geometry();
  const uint32_t tensors = geometry.tensors_per_layer();
  const size_t n = g.run_spans.size();
  const size_t groups = std::min(n, kWindowGroups);
  std::vector<WindowWork::Bind> out;
  out.reserve(groups * tensors);
  for (size_t i = 0; i < groups; ++i) {
    // Group i: runs [i*n/G, (i+1)*n/G), and the blocks from its lowest to
    // its highest (a window is one range).
    uint64_t first = UINT64_MAX, end = 0;
    for (size_t r = i * n / groups; r < (i + 1) * n / groups; ++r) {
      first = std::min<uint64_t>(first, g.run_spans[r].first);
      end = std::max<uint64_t>(end, uint64_t{g.run_spans[r].first} + g.run_spans[r].count);
    }
    for (uint32_t slot = 0; slot < tensors; ++slot) {
      const uint64_t bb = geometry.block_bytes(geometry.tensor_at(slot));
      out.push_back(WindowWork::Bind{nullptr, &registration_->registration(g.layer, slot),
                                     registration_->address(g.layer, slot) + first * bb,
                                     (end - first) * bb});
    }
  }
  return out;
}

Status RdmaSession::bind_waiting(std::vector<Grant>& answers) {
  while (!awaiting_windows_.empty()) {
    const uint32_t imm = awaiting_windows_.front();
    Granted& g = transfers_.at(imm);
    std::vector<WindowWork::Bind> binds = window_spans(g);
    bool refused = false;
    while (spare_windows_.size() < binds.size() && windows_held_ < listener_.max_windows) {
      Result<std::unique_ptr<Window>> w = listener_.fabric()->allocate_window();
      if (!w) {
        // The device's windows are shared by every session: wait for this
        // one's to come back, unless it holds none in use.
        if (windows_held_ > spare_windows_.size()) return {};
        std::string why = fmt::format(
            "the receiver cannot allocate memory windows for it on {} ({} held by this "
            "session): {}",
            listener_.fabric()->name(), windows_held_, w.error().message);
        spdlog::warn("rank {}: refused an rdma transfer from {}: {}", listener_.rank(), peer_,
                     why);
        answers.push_back(Grant{g.transfer, false, std::move(why), {}, true});
        granted_open_bytes_ -= g.bytes;
        abandon(g);
        transfers_.erase(imm);
        awaiting_windows_.pop_front();
        refused = true;
        break;
      }
      spare_windows_.push_back(std::move(w).value());
      ++windows_held_;
    }
    if (refused) continue;
    if (binds.empty()) {  // an intent of no runs: nothing to bind, nothing to wait for
      g.stage = Stage::kGranted;
      g.granted_at = std::chrono::steady_clock::now();
      std::vector<Grant> parts = grant_keys(g);
      answers.insert(answers.end(), parts.begin(), parts.end());
      awaiting_windows_.pop_front();
      continue;
    }
    if (spare_windows_.size() < binds.size()) return {};  // until landings return some
    for (WindowWork::Bind& b : binds) {
      g.windows.push_back(std::move(spare_windows_.back()));
      spare_windows_.pop_back();
      b.window = g.windows.back().get();
    }
    g.stage = Stage::kBinding;
    WindowWork& work = *window_work_[g.queue_pair];
    work.bind(immediate_of(g.transfer), binds);
    awaiting_windows_.pop_front();
    if (Status s = work.post(); !s) return s;
  }
  return {};
}

void RdmaSession::land(uint32_t imm, std::vector<Ack>& acks) {
  auto it = transfers_.find(imm);
  Granted& g = it->second;
  for (const LandedWrite& w : g.writes)
    arrivals_.landed(w);
  open_writes_ -= g.writes.size();
  bytes_landed_ += g.bytes;
  granted_open_bytes_ -= g.bytes;
  last_landed_ = std::chrono::steady_clock::now();
  acks.push_back({g.transfer, listener_.pool().check_intact()});
  for (std::unique_ptr<Window>& w : g.windows)
    spare_windows_.push_back(std::move(w));
  transfers_.erase(it);
}

Result<std::optional<std::vector<Grant>>> RdmaSession::on_intent(const Intent& part) {
  const uint32_t imm = immediate_of(part.transfer);
  if (transfers_.size() >= kMaxOpenTransfers && transfers_.count(imm) == 0)
    return broken(fmt::format("more than {} rdma transfers open on one session",
                              kMaxOpenTransfers));
  // Not a structured binding: the refusal below captures the iterator.
  const auto [emplaced, fresh] = transfers_.try_emplace(imm);
  const auto it = emplaced;
  Granted& g = it->second;
  if (fresh) {
    g.transfer = part.transfer;
    g.layer = part.layer;
    g.queue_pair = part.queue_pair;
  } else if (g.transfer != part.transfer || g.stage != Stage::kAsked) {
    return broken(fmt::format("an rdma intent for transfer {} while transfer {} holds its "
                              "immediate",
                              part.transfer, g.transfer));
  } else if (g.layer != part.layer || g.queue_pair != part.queue_pair) {
    return broken(fmt::format("the parts of rdma intent {} name layers {} and {}, queue pairs "
                              "{} and {}",
                              part.transfer, g.layer, part.layer, g.queue_pair,
                              part.queue_pair));
  }
  if (part.queue_pair >= queue_pairs_.size())
    return broken(fmt::format("an rdma intent for queue pair {} of a session of {}",
                              part.queue_pair, queue_pairs_.size()));
  const PoolGeometry& geometry = listener_.pool().geometry();
  // Runs do not overlap in a transfer of ours: more of them than the layer
  // has blocks is a peer that would grow this without bound.
  g.runs += part.runs.size();
  if (part.layer < geometry.total_layers() && g.runs > geometry.blocks_in_layer(part.layer))
    return broken(fmt::format("an rdma intent of {} runs for a layer of {} blocks", g.runs,
                              geometry.blocks_in_layer(part.layer)));
  // Each part gets a grant part: one that adds nothing would grow this.
  if (part.runs.empty() && !part.last)
    return broken(fmt::format("an rdma intent part for transfer {} with no runs", part.transfer));
  g.part_runs.push_back(part.runs.size());
  if (registration_->windows())
    g.run_spans.insert(g.run_spans.end(), part.runs.begin(), part.runs.end());
  // Heterogeneous TP: a head range of each block (all heads: whole blocks).
  const uint32_t heads = part.heads == geometry.kv_heads ? 0 : part.heads;
  if (heads != 0 && uint64_t{part.first_head} + heads > geometry.kv_heads && g.refused.empty())
    g.refused = fmt::format("rdma intent writes heads {}..{}, but the pool has {} per block",
                            part.first_head, uint64_t{part.first_head} + heads - 1,
                            geometry.kv_heads);
  for (const BlockSpan& run : part.runs) {
    if (!g.refused.empty()) break;
    if (part.layer >= geometry.total_layers()) {
      g.refused = fmt::format("rdma intent for layer {}, but the pool has {} layers", part.layer,
                              geometry.total_layers());
      break;
    }
    const uint32_t blocks = geometry.blocks_in_layer(part.layer);
    if (run.count == 0 || run.first >= blocks || run.count > blocks - run.first) {
      g.refused = fmt::format(
          "rdma intent writes destination blocks {}..{} of layer {}, but the pool has {} "
          "blocks there",
          run.first, uint64_t{run.first} + run.count - 1, part.layer, blocks);
      break;
    }
    if (heads == 0) {
      for (uint32_t slot = 0; slot < geometry.tensors_per_layer() && g.refused.empty(); ++slot) {
        const PoolTensor tensor = geometry.tensor_at(slot);
        const auto t = static_cast<uint32_t>(tensor);  // landed writes name it by its id
        const uint64_t bb = geometry.block_bytes(tensor);
        admit(g, LandedWrite{part.request_key, part.layer, t, run.first * bb, run.count * bb,
                             sender_});
      }
      continue;
    }
    // Heterogeneous TP: each block's head range is a write of its own.
    for (uint64_t b = run.first; b < uint64_t{run.first} + run.count && g.refused.empty(); ++b) {
      for (uint32_t slot = 0; slot < geometry.tensors_per_layer() && g.refused.empty(); ++slot) {
        const PoolTensor tensor = geometry.tensor_at(slot);
        const auto t = static_cast<uint32_t>(tensor);  // landed writes name it by its id
        const uint64_t bb = geometry.block_bytes(tensor);
        const uint64_t hb = bb / geometry.kv_heads;
        admit(g, LandedWrite{part.request_key, part.layer, t, b * bb + part.first_head * hb,
                             heads * hb, sender_});
      }
    }
  }
  if (!part.last) return std::optional<std::vector<Grant>>{};
  const auto refusal = [&](std::string why) {
    abandon(g);
    transfers_.erase(it);
    return std::optional<std::vector<Grant>>(
        std::vector<Grant>{Grant{part.transfer, false, std::move(why), {}, true}});
  };
  if (!g.refused.empty()) {
    spdlog::warn("rank {}: refused an rdma transfer from {}: {}", listener_.rank(), peer_,
                 g.refused);
    return refusal(g.refused);
  }
  // What a peer may have in the air at once, and so how long its grants may
  // take (overdue()): 4 GiB is several layers of a 128k-token prompt of a
  // large model.
  if (granted_open_bytes_ + g.bytes > listener_.max_granted_bytes)
    return refusal(fmt::format(
        "{} bytes are granted on this session and not landed yet; {} more would pass the limit "
        "of {} bytes",
        granted_open_bytes_, g.bytes, listener_.max_granted_bytes));
  const size_t windows = std::min(g.run_spans.size(), kWindowGroups) *
                         geometry.tensors_per_layer();
  if (windows > listener_.max_windows)
    return refusal(fmt::format("rdma transfer {} needs {} memory windows; a session holds at most {}",
                               part.transfer, windows, listener_.max_windows));
  granted_open_bytes_ += g.bytes;
  if (registration_->windows()) {
    // The grant goes out of poll() once its windows are bound.
    g.stage = Stage::kAwaitingWindows;
    awaiting_windows_.push_back(imm);
    std::vector<Grant> answers;
    if (Status s = bind_waiting(answers); !s) return s.error();
    if (answers.empty()) return std::optional<std::vector<Grant>>{};
    return std::optional<std::vector<Grant>>(std::move(answers));
  }
  g.stage = Stage::kGranted;
  g.granted_at = std::chrono::steady_clock::now();
  std::vector<Grant> grant = grant_keys(g);
  g.part_runs = {};
  return std::optional<std::vector<Grant>>(std::move(grant));
}

std::optional<std::string> RdmaSession::overdue(std::chrono::milliseconds grace) const {
  const Granted* oldest = nullptr;
  for (const auto& [imm, g] : transfers_) {
    if (g.stage == Stage::kAsked || g.stage == Stage::kInvalidating) continue;
    for (const LandedWrite& w : g.writes)
      if (w.request_key != 0 && arrivals_.withdrawing(w.request_key))
        return fmt::format(
            "the request of granted rdma transfer {} was withdrawn before its "
            "writes landed",
            g.transfer);
    // Only a grant the peer holds is its to answer for; one still waiting
    // for windows or binds is this side's delay.
    if (g.stage != Stage::kGranted) continue;
    if (oldest == nullptr || g.granted_at < oldest->granted_at) oldest = &g;
  }
  if (oldest == nullptr) return std::nullopt;
  const auto allowed =
      grace + std::chrono::milliseconds(oldest->bytes * 1000 / kMinRateBytesPerSecond);
  const auto since = std::max(oldest->granted_at, last_landed_);
  if (std::chrono::steady_clock::now() - since > allowed)
    return fmt::format(
        "the writes of granted rdma transfer {} ({} bytes) did not land within {} ms of {}",
        oldest->transfer, oldest->bytes, allowed.count(),
        since == oldest->granted_at ? "its grant" : "the previous transfer's");
  return std::nullopt;
}

Status RdmaSession::poll(std::vector<Ack>& acks, std::vector<Grant>& grants) {
  std::array<WorkCompletion, 64> wcs;
  for (size_t q = 0; q < queue_pairs_.size(); ++q) {
    RcQueuePair& qp = *queue_pairs_[q];
    WindowWork* work = window_work_.empty() ? nullptr : window_work_[q].get();
    if (Status s = qp.arm(); !s) return s;
    for (;;) {
      // This side's sends are its window binds and invalidations (first: a
      // failed one is what fails the receives after it); without windows
      // there are none, but a flushed queue is seen here too.
      finished_.clear();
      const size_t m = qp.poll_send(wcs);
      for (size_t i = 0; i < m; ++i) {
        if (work == nullptr) {
          if (!wcs[i].ok)
            return broken(fmt::format("{}: completed with '{}'", qp.name(), wcs[i].status));
          continue;
        }
        if (Status s = work->complete(wcs[i], finished_); !s) return s;
      }
      if (work != nullptr) work->take_empty(finished_);
      for (const uint32_t imm : finished_) {
        Granted& g = transfers_.at(imm);
        if (g.stage == Stage::kInvalidating) {
          land(imm, acks);
          continue;
        }
        g.stage = Stage::kGranted;
        g.granted_at = std::chrono::steady_clock::now();
        std::vector<Grant> parts = grant_keys(g);
        g.part_runs = {};
        g.run_spans = {};
        grants.insert(grants.end(), std::make_move_iterator(parts.begin()),
                      std::make_move_iterator(parts.end()));
      }
      const size_t n = qp.poll_receive(wcs);
      for (size_t i = 0; i < n; ++i) {
        const WorkCompletion& wc = wcs[i];
        if (!wc.ok)
          return broken(fmt::format("{}: a receive completed with '{}'", qp.name(), wc.status));
        if (!wc.immediate) return broken(fmt::format("{}: a receive without an immediate", qp.name()));
        auto it = transfers_.find(*wc.immediate);
        if (it == transfers_.end() || it->second.stage != Stage::kGranted)
          return broken(fmt::format("{}: writes landed for immediate {:#x}, which no granted "
                                    "transfer holds",
                                    qp.name(), *wc.immediate));
        if (it->second.queue_pair != q)
          return broken(fmt::format("{}: writes landed for rdma transfer {}, granted on queue "
                                    "pair {}",
                                    qp.name(), it->second.transfer, it->second.queue_pair));
        if (Status s = qp.post_receive(wc.wr_id); !s) return s;
        if (work == nullptr) {
          land(*wc.immediate, acks);
          continue;
        }
        // Its windows are taken back before its writes count: nothing of
        // this peer's lands in them afterwards.
        Granted& g = it->second;
        g.stage = Stage::kInvalidating;
        std::vector<uint32_t> rkeys;
        rkeys.reserve(g.windows.size());
        for (const auto& w : g.windows)
          rkeys.push_back(w->rkey());
        work->invalidate(*wc.immediate, rkeys);
        if (Status s = work->post(); !s) return s;
      }
      // Invalidations just posted often complete at once: look again
      // rather than wait for the fd.
      const bool invalidating = work != nullptr && n > 0;
      if (n < wcs.size() && m < wcs.size() && !invalidating) break;
    }
  }
  // Landings gave windows back: transfers waiting for them get them now.
  return bind_waiting(grants);
}

}  // namespace kvrelay::worker::rdma
