#include "worker/net/peer_plan.h"

#include <fmt/format.h>

namespace kvrelay::worker::net {

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
    plan.targets.push_back(
        PeerPlan::Target{PeerAddress{dest.getPeerAddress().cStr(), ports[share.decode_rank],
                                     share.decode_rank, dest.getPeerInstance().cStr()},
                         share});
  return plan;
}

HeadLayout sender_heads(const PoolGeometry& pool, uint32_t tp_size, uint32_t total_kv_heads) {
  return HeadLayout{tp_size, pool.kv_heads,
                    total_kv_heads != 0 ? total_kv_heads : pool.kv_heads * tp_size};
}

namespace {
// The request names a destination block the receiver's pool lacks in some
// layer (the request writes every layer).
std::optional<std::string> block_refusal(const LayerJob& job, const PoolGeometry& pool) {
  const uint32_t end = job.ticket.dst_block_end;
  if (end == 0) return std::nullopt;
  for (uint32_t layer : {0u, pool.num_layers}) {
    if (layer >= pool.total_layers()) continue;
    if (end > pool.blocks_in_layer(layer))
      return fmt::format(
          "destination block {} is outside the decode pool, which has {} blocks in layer {}: "
          "nothing of this request was sent",
          end - 1, pool.blocks_in_layer(layer), layer);
  }
  return std::nullopt;
}
}  // namespace

std::optional<std::string> layout_refusal(const LayerJob& job, const HelloAck& ack) {
  if (std::optional<std::string> why = block_refusal(job, ack.pool)) return why;
  const HeadLayout& want = job.decode_layout;
  if (want.tp_size == 0) return std::nullopt;
  if (ack.tp_size == 0) {
    if (!job.share) return std::nullopt;  // an older or bare receiver: the pools match exactly
    return std::string("the receiver does not say its TP layout, so heads cannot be split for it");
  }
  if (ack.tp_size == want.tp_size && ack.total_kv_heads == want.total_heads &&
      ack.pool.kv_heads == want.heads_per_rank)
    return std::nullopt;
  return fmt::format(
      "the decode instance has tp {} with {} KV heads per rank ({} in all), but this "
      "request was planned for tp {} with {} ({} in all): its port list names {} "
      "ranks",
      ack.tp_size, ack.pool.kv_heads, ack.total_kv_heads, want.tp_size, want.heads_per_rank,
      want.total_heads, want.tp_size);
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

}  // namespace kvrelay::worker::net
