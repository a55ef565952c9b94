#include "worker/tcp/peer_link.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>

namespace kvrelay::worker::tcp {

namespace {
constexpr auto kMinBackoff = std::chrono::milliseconds(100);
constexpr auto kMaxBackoff = std::chrono::milliseconds(5000);
}  // namespace

uint32_t PeerLink::blocks_in_layer(uint32_t layer) const {
  if (!known_.load(std::memory_order_acquire)) return UINT32_MAX;
  return layer < layers_.load(std::memory_order_relaxed)
             ? blocks_.load(std::memory_order_relaxed)
             : extra_blocks_.load(std::memory_order_relaxed);
}

std::optional<std::string> PeerLink::backing_off() const {
  const auto now = Clock::now();
  if (now >= retry_at_) return std::nullopt;
  return fmt::format(
      "cannot reach it: {} (next attempt in {} ms)", last_error_,
      std::chrono::duration_cast<std::chrono::milliseconds>(retry_at_ - now).count());
}

void PeerLink::connected(const HelloAck& ack) {
  if (epoch_ != 0 && epoch_ != ack.epoch)
    spdlog::info("rank {}: {} restarted (a new pool there)", rank_, name_);
  epoch_ = ack.epoch;
  layers_.store(ack.pool.num_layers, std::memory_order_relaxed);
  blocks_.store(ack.pool.num_blocks, std::memory_order_relaxed);
  extra_blocks_.store(ack.pool.extra_layer_blocks, std::memory_order_relaxed);
  known_.store(true, std::memory_order_release);
  stats_->opened.fetch_add(1, std::memory_order_relaxed);
  backoff_ = std::chrono::milliseconds(0);
  retry_at_ = {};
  for (auto& w : std::exchange(waiters_, {}))
    w({});
}

void PeerLink::unreachable(const std::string& why) {
  stats_->unreachable.fetch_add(1, std::memory_order_relaxed);
  last_error_ = why;
  backoff_ = std::clamp(backoff_ * 2, std::chrono::milliseconds(kMinBackoff),
                        std::chrono::milliseconds(kMaxBackoff));
  retry_at_ = Clock::now() + backoff_;
  spdlog::warn("rank {}: cannot reach {}: {} (retrying after {} ms)", rank_, name_, why,
               backoff_.count());
  for (auto& w : std::exchange(waiters_, {}))
    w(make_error(Errc::kTimeout, fmt::format("cannot reach {}: {}", name_, why)));
}

void PeerLink::lost(const std::string& why) const {
  stats_->lost.fetch_add(1, std::memory_order_relaxed);
  spdlog::warn("rank {}: {} to {} closed: {}", rank_, connection_, name_, why);
}

void PeerLink::stop() {
  for (auto& w : std::exchange(waiters_, {}))
    w(make_error(Errc::kAborted, "the worker's transport is stopping"));
}

Result<PeerAddress> destination_address(schema::CacheDest::Reader dest,
                                        capnp::List<uint16_t>::Reader ports,
                                        const char* ports_field, uint32_t rank) {
  const auto devices = dest.getDeviceIds();
  const uint32_t decode_rank = rank < devices.size() ? devices[rank] : rank;
  if (decode_rank >= ports.size())
    return make_error(Errc::kInvalidArgument,
                      fmt::format("{} has {} ports, none for decode rank {}", ports_field,
                                  ports.size(), decode_rank));
  return PeerAddress{dest.getPeerAddress().cStr(), ports[decode_rank], decode_rank,
                     dest.getPeerInstance().cStr()};
}

Result<PeerPlan> plan_peers(schema::CacheDest::Reader dest, capnp::List<uint16_t>::Reader ports,
                            const char* ports_field, uint32_t rank, const HeadLayout& mine) {
  PeerPlan plan;
  if (ports.size() == mine.tp_size) {
    Result<PeerAddress> at = destination_address(dest, ports, ports_field, rank);
    if (!at) return at.error();
    plan.targets.push_back(PeerPlan::Target{std::move(at).value(), std::nullopt});
    plan.decode_layout = mine;
    return plan;
  }
  if (ports.size() == 0)
    return make_error(Errc::kInvalidArgument, fmt::format("{} is empty", ports_field));
  const uint32_t n = ports.size();
  plan.decode_layout =
      HeadLayout{n, mine.total_heads >= n ? mine.total_heads / n : 1, mine.total_heads};
  if (Status s = plan.decode_layout.check(); !s)
    return make_error(Errc::kLayoutMismatch,
                      fmt::format("{} names {} decode ranks (heterogeneous TP), which cannot hold "
                                  "this model's {} KV heads: {}",
                                  ports_field, n, mine.total_heads, s.error().message));
  for (const HeadShare& share : head_shares(mine, rank, plan.decode_layout))
    plan.targets.push_back(PeerPlan::Target{
        PeerAddress{dest.getPeerAddress().cStr(), ports[share.decode_rank], share.decode_rank,
                    dest.getPeerInstance().cStr()},
        share});
  return plan;
}

HeadLayout sender_heads(const PoolGeometry& pool, uint32_t tp_size, uint32_t total_kv_heads) {
  return HeadLayout{tp_size, pool.kv_heads,
                    total_kv_heads != 0 ? total_kv_heads : pool.kv_heads * tp_size};
}

std::optional<std::string> layout_refusal(const LayerJob& job, const HelloAck& ack) {
  const HeadLayout& want = job.decode_layout;
  if (want.tp_size == 0) return std::nullopt;
  if (ack.tp_size == 0) {
    if (!job.share) return std::nullopt;  // an older or bare receiver: the pools match exactly
    return std::string("the receiver does not say its TP layout, so heads cannot be split for it");
  }
  if (ack.tp_size == want.tp_size && ack.total_kv_heads == want.total_heads &&
      ack.pool.kv_heads == want.heads_per_rank)
    return std::nullopt;
  return fmt::format("the decode instance has tp {} with {} KV heads per rank ({} in all), but this "
                     "request was planned for tp {} with {} ({} in all): its port list names {} "
                     "ranks",
                     ack.tp_size, ack.pool.kv_heads, ack.total_kv_heads, want.tp_size,
                     want.heads_per_rank, want.total_heads, want.tp_size);
}

Result<PeerAddress> connect_address(schema::ConnectTask::Reader connect, uint32_t rank) {
  const auto ports = connect.getPorts();
  if (rank >= ports.size())
    return make_error(Errc::kInvalidArgument, fmt::format("no port for rank {}", rank));
  return PeerAddress{connect.getPeerAddress().cStr(), ports[rank], rank,
                     connect.getPeerInstance().cStr()};
}

Result<std::vector<PeerAddress>> connect_addresses(schema::ConnectTask::Reader connect,
                                                   uint32_t rank, const HeadLayout& mine) {
  const auto ports = connect.getPorts();
  if (ports.size() == mine.tp_size || ports.size() == 0) {
    Result<PeerAddress> at = connect_address(connect, rank);
    if (!at) return at.error();
    return std::vector<PeerAddress>{std::move(at).value()};
  }
  const uint32_t n = ports.size();
  const HeadLayout theirs{n, mine.total_heads >= n ? mine.total_heads / n : 1, mine.total_heads};
  if (Status s = theirs.check(); !s)
    return make_error(Errc::kLayoutMismatch,
                      fmt::format("ports names {} decode ranks (heterogeneous TP), which cannot "
                                  "hold this model's {} KV heads: {}",
                                  n, mine.total_heads, s.error().message));
  std::vector<PeerAddress> all;
  for (const HeadShare& share : head_shares(mine, rank, theirs))
    all.push_back(PeerAddress{connect.getPeerAddress().cStr(), ports[share.decode_rank],
                              share.decode_rank, connect.getPeerInstance().cStr()});
  return all;
}

Status await_connected(boost::asio::any_io_executor strand,
                       std::function<void(std::function<void(Status)>)> ensure,
                       const std::string& name, std::chrono::milliseconds timeout) {
  auto result = std::make_shared<std::promise<Status>>();
  std::future<Status> answer = result->get_future();
  boost::asio::post(strand, [ensure = std::move(ensure), result] {
    ensure([result](Status s) { result->set_value(std::move(s)); });
  });
  if (answer.wait_for(timeout + std::chrono::milliseconds(500)) != std::future_status::ready)
    return make_error(Errc::kTimeout,
                      fmt::format("no answer from {} within {} ms", name, timeout.count()));
  return answer.get();
}

void plan_frames(const LayerJob& job, const PoolGeometry& local, uint32_t peer_kv_heads,
                 std::vector<kernels::CopyRun>& scratch, std::vector<PlannedFrame>& out) {
  out.clear();
  const uint32_t layer = job.ticket.layer;
  for (uint32_t t = 0; t < local.tensors_per_layer(); ++t) {
    const auto tensor = static_cast<PoolTensor>(t);
    if (job.share) {
      const uint64_t head = local.block_bytes(tensor) / local.kv_heads;
      to_head_runs(job.runs, local.block_bytes(tensor), head * peer_kv_heads, head, *job.share,
                   scratch);
    } else {
      to_byte_runs(job.runs, local.block_bytes(tensor), scratch);
    }
    for (const kernels::CopyRun& r : scratch) {
      PlannedFrame p;
      p.header.transfer = job.transfer;
      p.header.request_key = job.ticket.request_key;
      p.header.handle = job.ticket.handle;
      p.header.layer = layer;
      p.header.tensor = t;
      p.header.dst_offset = r.dst_offset;
      p.header.bytes = r.bytes;
      p.src_offset = r.src_offset;
      out.push_back(p);
    }
  }
  // Only now is the last frame known: a head share of part of a block has a
  // frame per block, more than the job's coalesced runs. (Counting runs once
  // marked a frame in the middle `last`: the receiver acked the transfer
  // before the rest of it had landed.)
  if (!out.empty()) out.back().header.last = true;
}

void split_to_fit(const PlannedFrame& frame, const PoolGeometry& local, uint64_t limit,
                  std::deque<PlannedFrame>& out) {
  const uint64_t block = local.block_bytes(static_cast<PoolTensor>(frame.header.tensor));
  if (frame.header.bytes <= limit || block == 0 || block > limit) {
    out.push_back(frame);
    return;
  }
  const uint64_t piece_max = limit / block * block;
  for (uint64_t done = 0; done < frame.header.bytes;) {
    PlannedFrame piece = frame;
    piece.header.bytes = std::min(piece_max, frame.header.bytes - done);
    piece.header.dst_offset += done;
    piece.src_offset += done;
    done += piece.header.bytes;
    piece.header.last = frame.header.last && done == frame.header.bytes;
    out.push_back(piece);
  }
}

}  // namespace kvrelay::worker::tcp
