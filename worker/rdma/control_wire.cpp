#include "worker/rdma/control_wire.h"

#include <fmt/format.h>

namespace kvrelay::worker::rdma {

namespace {

// kV2GrantKind: wire version 2's grant, which carried no keys.
enum : uint16_t { kOfferKind, kAcceptKind, kIntentKind, kV2GrantKind, kAckKind, kGrantKind };

std::string capped(capnp::Text::Reader t) {
  return std::string(t.cStr(), std::min<size_t>(t.size(), net::kMaxTextBytes));
}

Result<std::vector<QpEndpoint>> endpoints_of(capnp::List<schema::RdmaQpInfo>::Reader list) {
  if (list.size() == 0 || list.size() > kMaxQueuePairs)
    return make_error(Errc::kCorrupt, fmt::format("{} rdma queue pairs offered (1 to {})",
                                                  list.size(), kMaxQueuePairs));
  std::vector<QpEndpoint> out;
  for (const auto qp : list) {
    Result<QpEndpoint> e = decode_endpoint(qp);
    if (!e) return e.error();
    out.push_back(*e);
  }
  return out;
}

Answer answer_of(schema::TcpAck::Reader a) {
  return Answer{a.getTransfer(), a.getOk(), capped(a.getReason())};
}

void set_answer(schema::TcpAck::Builder a, uint64_t transfer, bool ok, const std::string& reason) {
  a.setTransfer(transfer);
  a.setOk(ok);
  a.setReason(reason.substr(0, net::kMaxTextBytes));
}

}  // namespace

Result<Message> decode(const net::Inbound& in) {
  return net::with_body<schema::RdmaMessage>(
      in, [](schema::RdmaMessage::Reader m) -> Result<Message> {
        Message out;
        switch (m.which()) {
          case schema::RdmaMessage::OFFER: {
            out.kind = Message::Kind::kOffer;
            Result<std::vector<QpEndpoint>> qps = endpoints_of(m.getOffer().getQueuePairs());
            if (!qps) return qps.error();
            out.offer = std::move(qps).value();
            return out;
          }
          case schema::RdmaMessage::ACCEPT: {
            out.kind = Message::Kind::kAccept;
            const auto a = m.getAccept();
            out.accept.accepted = a.getAccepted();
            out.accept.reason = capped(a.getReason());
            if (!out.accept.accepted) return out;
            Result<std::vector<QpEndpoint>> qps = endpoints_of(a.getQueuePairs());
            if (!qps) return qps.error();
            out.accept.queue_pairs = std::move(qps).value();
            out.accept.regions = copy_regions(a.getRegions());
            return out;
          }
          case schema::RdmaMessage::INTENT: {
            out.kind = Message::Kind::kIntent;
            const auto i = m.getIntent();
            Intent& it = out.intent;
            it.transfer = i.getTransfer();
            it.request_key = i.getRequestKey();
            it.handle = i.getHandle();
            it.layer = i.getLayer();
            it.last = i.getLast();
            it.first_head = i.getFirstHead();
            it.heads = i.getHeads();
            it.queue_pair = i.getQueuePair();
            if (i.getRuns().size() > kMaxIntentRuns)
              return make_error(Errc::kCorrupt,
                                fmt::format("an rdma intent part with {} runs (at most {})",
                                            i.getRuns().size(), kMaxIntentRuns));
            it.runs.reserve(i.getRuns().size());
            for (const auto r : i.getRuns())
              it.runs.push_back({r.getFirst(), r.getCount()});
            return out;
          }
          case schema::RdmaMessage::GRANT:
            return make_error(Errc::kCorrupt,
                              "an rdma grant without keys (wire version 2; this side runs 3)");
          case schema::RdmaMessage::KEY_GRANT: {
            out.kind = Message::Kind::kGrant;
            const auto g = m.getKeyGrant();
            out.grant.transfer = g.getTransfer();
            out.grant.ok = g.getOk();
            out.grant.reason = capped(g.getReason());
            out.grant.last = g.getLast();
            if (g.getRkeys().size() > kMaxGrantKeys)
              return make_error(Errc::kCorrupt,
                                fmt::format("an rdma grant part with {} keys (at most {})",
                                            g.getRkeys().size(), kMaxGrantKeys));
            out.grant.rkeys.reserve(g.getRkeys().size());
            for (const uint32_t k : g.getRkeys())
              out.grant.rkeys.push_back(k);
            return out;
          }
          case schema::RdmaMessage::ACK:
            out.kind = Message::Kind::kAck;
            out.answer = answer_of(m.getAck());
            return out;
        }
        return make_error(Errc::kCorrupt, "an rdma message of a kind this version does not know");
      });
}

void encode_offer(std::span<const QpEndpoint> queue_pairs, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(256);
  auto list = net::init_message(m, kProtocol, kOfferKind)
                  .initAs<schema::RdmaMessage>()
                  .initOffer()
                  .initQueuePairs(static_cast<unsigned>(queue_pairs.size()));
  for (unsigned i = 0; i < queue_pairs.size(); ++i)
    encode_endpoint(queue_pairs[i], list[i]);
  net::append_envelope(m, out);
}

void encode_accept(bool accepted, const std::string& reason,
                   std::span<const QpEndpoint> queue_pairs, const PoolGeometry& geometry,
                   const std::vector<RemoteTensor>& tensors, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(1024);
  auto a = net::init_message(m, kProtocol, kAcceptKind).initAs<schema::RdmaMessage>().initAccept();
  a.setAccepted(accepted);
  a.setReason(reason.substr(0, net::kMaxTextBytes));
  if (accepted) {
    auto list = a.initQueuePairs(static_cast<unsigned>(queue_pairs.size()));
    for (unsigned i = 0; i < queue_pairs.size(); ++i)
      encode_endpoint(queue_pairs[i], list[i]);
    encode_regions(geometry, tensors, a.initRegions());
  }
  net::append_envelope(m, out);
}

void encode_intent(const Intent& intent, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(64 + intent.runs.size());
  auto i = net::init_message(m, kProtocol, kIntentKind).initAs<schema::RdmaMessage>().initIntent();
  i.setTransfer(intent.transfer);
  i.setRequestKey(intent.request_key);
  i.setHandle(intent.handle);
  i.setLayer(intent.layer);
  i.setLast(intent.last);
  i.setFirstHead(intent.first_head);
  i.setHeads(intent.heads);
  i.setQueuePair(intent.queue_pair);
  auto runs = i.initRuns(static_cast<unsigned>(intent.runs.size()));
  for (unsigned k = 0; k < intent.runs.size(); ++k) {
    runs[k].setFirst(intent.runs[k].first);
    runs[k].setCount(intent.runs[k].count);
  }
  net::append_envelope(m, out);
}

void encode_grant(const Grant& grant, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(64 + grant.rkeys.size() / 2);
  auto g = net::init_message(m, kProtocol, kGrantKind).initAs<schema::RdmaMessage>().initKeyGrant();
  g.setTransfer(grant.transfer);
  g.setOk(grant.ok);
  g.setReason(grant.reason.substr(0, net::kMaxTextBytes));
  g.setLast(grant.last);
  auto keys = g.initRkeys(static_cast<unsigned>(grant.rkeys.size()));
  for (unsigned k = 0; k < grant.rkeys.size(); ++k)
    keys.set(k, grant.rkeys[k]);
  net::append_envelope(m, out);
}

void encode_ack(uint64_t transfer, bool ok, const std::string& reason,
                std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(64);
  set_answer(net::init_message(m, kProtocol, kAckKind).initAs<schema::RdmaMessage>().initAck(),
             transfer, ok, reason);
  net::append_envelope(m, out);
}

}  // namespace kvrelay::worker::rdma
