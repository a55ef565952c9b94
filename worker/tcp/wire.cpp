#include "worker/tcp/wire.h"

#include <fmt/format.h>

#include <cstring>

#include "schemas/codec.h"
#include "schemas/pool_descriptor.h"
#include "worker/pool_compatibility.h"

namespace kvrelay::worker::tcp {

namespace {

constexpr size_t kMaxTextBytes = 1024;

std::string capped(capnp::Text::Reader t) {
  return std::string(t.cStr(), std::min<size_t>(t.size(), kMaxTextBytes));
}

std::vector<uint8_t> bytes_of(capnp::Data::Reader d, size_t max) {
  if (d.size() > max) return {};
  return std::vector<uint8_t>(d.begin(), d.end());
}

void append(capnp::MessageBuilder& message, std::vector<std::byte>& out) {
  const size_t body = messages::encoded_bytes(message);
  const size_t at = out.size();
  out.resize(at + 4 + body);
  const auto len = static_cast<uint32_t>(body);
  const uint8_t prefix[4] = {static_cast<uint8_t>(len), static_cast<uint8_t>(len >> 8),
                             static_cast<uint8_t>(len >> 16), static_cast<uint8_t>(len >> 24)};
  std::memcpy(out.data() + at, prefix, 4);
  messages::encode_into(message, std::span<std::byte>(out.data() + at + 4, body));
}

Result<std::vector<rdma::QpEndpoint>> endpoints_of(capnp::List<schema::RdmaQpInfo>::Reader list) {
  if (list.size() == 0 || list.size() > kMaxRdmaQueuePairs)
    return make_error(Errc::kCorrupt, fmt::format("{} rdma queue pairs offered (1 to {})",
                                                  list.size(), kMaxRdmaQueuePairs));
  std::vector<rdma::QpEndpoint> out;
  for (const auto qp : list) {
    Result<rdma::QpEndpoint> e = rdma::decode_endpoint(qp);
    if (!e) return e.error();
    out.push_back(*e);
  }
  return out;
}

}  // namespace

Result<uint32_t> parse_length(std::span<const uint8_t, 4> p) {
  const uint32_t len =
      uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
  if (len == 0 || len % 8 != 0 || len > kMaxEnvelopeBytes)
    return make_error(Errc::kCorrupt,
                      fmt::format("a message of {} bytes is not a kvrelay tcp envelope (whole "
                                  "8-byte words, at most {} bytes)",
                                  len, kMaxEnvelopeBytes));
  return len;
}

Result<Inbound> decode_envelope(std::span<const std::byte> body) {
  messages::ReadLimits limits;
  limits.traversal_words = kMaxEnvelopeBytes / 8;
  limits.nesting = 8;
  return messages::with_message<schema::TcpEnvelope>(
      body,
      [&](schema::TcpEnvelope::Reader e) -> Result<Inbound> {
        Inbound in;
        in.kind = e.which();
        switch (in.kind) {
          case schema::TcpEnvelope::CHALLENGE:
            in.nonce = bytes_of(e.getChallenge().getNonce(), kNonceBytes);
            break;
          case schema::TcpEnvelope::PROOF:
            in.nonce = bytes_of(e.getProof().getNonce(), kNonceBytes);
            in.mac = bytes_of(e.getProof().getMac(), kMacBytes);
            break;
          case schema::TcpEnvelope::HELLO: {
            const auto h = e.getHello();
            in.hello.version = h.getProtocolVersion();
            in.hello.instance = capped(h.getInstance());
            in.hello.expected_instance = capped(h.getExpectedInstance());
            in.hello.rank = h.getRank();
            in.hello.tp_size = h.getTpSize();
            in.hello.total_kv_heads = h.getTotalKvHeads();
            in.hello.pool = messages::shape_of(h.getPool());
            break;
          }
          case schema::TcpEnvelope::HELLO_ACK: {
            const auto a = e.getHelloAck();
            in.hello_ack.accepted = a.getAccepted();
            in.hello_ack.reason = capped(a.getReason());
            in.hello_ack.pool = messages::shape_of(a.getPool());
            in.hello_ack.epoch = a.getEpoch();
            in.hello_ack.proof = bytes_of(a.getProof(), kMacBytes);
            in.hello_ack.tp_size = a.getTpSize();
            in.hello_ack.total_kv_heads = a.getTotalKvHeads();
            break;
          }
          case schema::TcpEnvelope::FRAME: {
            const auto f = e.getFrame();
            in.frame.transfer = f.getTransfer();
            in.frame.request_key = f.getRequestKey();
            in.frame.handle = f.getHandle();
            in.frame.layer = f.getLayer();
            in.frame.tensor = f.getTensor();
            in.frame.dst_offset = f.getDstOffset();
            in.frame.bytes = f.getBytes();
            in.frame.last = f.getLast();
            break;
          }
          case schema::TcpEnvelope::ACK: {
            const auto a = e.getAck();
            in.ack_transfer = a.getTransfer();
            in.ack_ok = a.getOk();
            in.ack_reason = capped(a.getReason());
            break;
          }
          case schema::TcpEnvelope::HEARTBEAT: break;
          case schema::TcpEnvelope::RDMA_OFFER: {
            Result<std::vector<rdma::QpEndpoint>> qps =
                endpoints_of(e.getRdmaOffer().getQueuePairs());
            if (!qps) return qps.error();
            in.rdma_offer = std::move(qps).value();
            break;
          }
          case schema::TcpEnvelope::RDMA_ACCEPT: {
            const auto a = e.getRdmaAccept();
            in.rdma_accept.accepted = a.getAccepted();
            in.rdma_accept.reason = capped(a.getReason());
            if (!in.rdma_accept.accepted) break;
            Result<std::vector<rdma::QpEndpoint>> qps = endpoints_of(a.getQueuePairs());
            if (!qps) return qps.error();
            in.rdma_accept.queue_pairs = std::move(qps).value();
            in.rdma_accept.regions = rdma::copy_regions(a.getRegions());
            break;
          }
          case schema::TcpEnvelope::RDMA_INTENT: {
            const auto i = e.getRdmaIntent();
            RdmaIntent& out = in.rdma_intent;
            out.transfer = i.getTransfer();
            out.request_key = i.getRequestKey();
            out.handle = i.getHandle();
            out.layer = i.getLayer();
            out.last = i.getLast();
            out.first_head = i.getFirstHead();
            out.heads = i.getHeads();
            if (i.getRuns().size() > kMaxIntentRuns)
              return make_error(Errc::kCorrupt,
                                fmt::format("an rdma intent part with {} runs (at most {})",
                                            i.getRuns().size(), kMaxIntentRuns));
            out.runs.reserve(i.getRuns().size());
            for (const auto r : i.getRuns())
              out.runs.push_back({r.getFirst(), r.getCount()});
            break;
          }
          case schema::TcpEnvelope::RDMA_GRANT: {
            const auto a = e.getRdmaGrant();
            in.ack_transfer = a.getTransfer();
            in.ack_ok = a.getOk();
            in.ack_reason = capped(a.getReason());
            break;
          }
          default:
            return make_error(Errc::kCorrupt, "an envelope of a kind this version does not know");
        }
        return in;
      },
      limits);
}

void encode_challenge(const Nonce& nonce, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(64);
  m.initRoot<schema::TcpEnvelope>().initChallenge().setNonce(
      kj::arrayPtr(nonce.data(), nonce.size()));
  append(m, out);
}

void encode_proof(const Nonce& nonce, const Mac& mac, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(64);
  auto p = m.initRoot<schema::TcpEnvelope>().initProof();
  p.setNonce(kj::arrayPtr(nonce.data(), nonce.size()));
  p.setMac(kj::arrayPtr(mac.data(), mac.size()));
  append(m, out);
}

void encode_hello(const Hello& hello, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(128);
  auto h = m.initRoot<schema::TcpEnvelope>().initHello();
  h.setProtocolVersion(hello.version);
  h.setInstance(hello.instance);
  h.setExpectedInstance(hello.expected_instance);
  h.setRank(hello.rank);
  h.setTpSize(hello.tp_size);
  h.setTotalKvHeads(hello.total_kv_heads);
  messages::set_shape(h.initPool(), hello.pool);
  append(m, out);
}

void encode_hello_ack(const HelloAck& ack, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(128);
  auto a = m.initRoot<schema::TcpEnvelope>().initHelloAck();
  a.setAccepted(ack.accepted);
  a.setReason(ack.reason);
  messages::set_shape(a.initPool(), ack.pool);
  a.setEpoch(ack.epoch);
  a.setProof(kj::arrayPtr(ack.proof.data(), ack.proof.size()));
  a.setTpSize(ack.tp_size);
  a.setTotalKvHeads(ack.total_kv_heads);
  append(m, out);
}

void encode_frame(const FrameHeader& frame, std::vector<std::byte>& out) {
  capnp::word scratch[16] = {};
  capnp::MallocMessageBuilder m(kj::arrayPtr(scratch, 16));
  auto f = m.initRoot<schema::TcpEnvelope>().initFrame();
  f.setTransfer(frame.transfer);
  f.setRequestKey(frame.request_key);
  f.setHandle(frame.handle);
  f.setLayer(frame.layer);
  f.setTensor(frame.tensor);
  f.setDstOffset(frame.dst_offset);
  f.setBytes(frame.bytes);
  f.setLast(frame.last);
  append(m, out);
}

void encode_ack(uint64_t transfer, bool ok, const std::string& reason,
                std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(64);
  auto a = m.initRoot<schema::TcpEnvelope>().initAck();
  a.setTransfer(transfer);
  a.setOk(ok);
  a.setReason(reason.substr(0, kMaxTextBytes));
  append(m, out);
}

void encode_heartbeat(std::vector<std::byte>& out) {
  capnp::word scratch[4] = {};
  capnp::MallocMessageBuilder m(kj::arrayPtr(scratch, 4));
  m.initRoot<schema::TcpEnvelope>().setHeartbeat();
  append(m, out);
}

void encode_rdma_offer(std::span<const rdma::QpEndpoint> queue_pairs, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(256);
  auto list = m.initRoot<schema::TcpEnvelope>().initRdmaOffer().initQueuePairs(
      static_cast<unsigned>(queue_pairs.size()));
  for (unsigned i = 0; i < queue_pairs.size(); ++i)
    rdma::encode_endpoint(queue_pairs[i], list[i]);
  append(m, out);
}

void encode_rdma_accept(bool accepted, const std::string& reason,
                        std::span<const rdma::QpEndpoint> queue_pairs, const PoolGeometry& geometry,
                        const std::vector<rdma::RemoteTensor>& tensors,
                        std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(1024);
  auto a = m.initRoot<schema::TcpEnvelope>().initRdmaAccept();
  a.setAccepted(accepted);
  a.setReason(reason.substr(0, kMaxTextBytes));
  if (accepted) {
    auto list = a.initQueuePairs(static_cast<unsigned>(queue_pairs.size()));
    for (unsigned i = 0; i < queue_pairs.size(); ++i)
      rdma::encode_endpoint(queue_pairs[i], list[i]);
    rdma::encode_regions(geometry, tensors, a.initRegions());
  }
  append(m, out);
}

void encode_rdma_intent(const RdmaIntent& intent, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(64 + intent.runs.size());
  auto i = m.initRoot<schema::TcpEnvelope>().initRdmaIntent();
  i.setTransfer(intent.transfer);
  i.setRequestKey(intent.request_key);
  i.setHandle(intent.handle);
  i.setLayer(intent.layer);
  i.setLast(intent.last);
  i.setFirstHead(intent.first_head);
  i.setHeads(intent.heads);
  auto runs = i.initRuns(static_cast<unsigned>(intent.runs.size()));
  for (unsigned k = 0; k < intent.runs.size(); ++k) {
    runs[k].setFirst(intent.runs[k].first);
    runs[k].setCount(intent.runs[k].count);
  }
  append(m, out);
}

void encode_rdma_grant(uint64_t transfer, bool ok, const std::string& reason,
                       std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(64);
  auto a = m.initRoot<schema::TcpEnvelope>().initRdmaGrant();
  a.setTransfer(transfer);
  a.setOk(ok);
  a.setReason(reason.substr(0, kMaxTextBytes));
  append(m, out);
}

Status check_frame(const FrameHeader& f, const PoolGeometry& g) {
  if (f.layer >= g.total_layers())
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("frame for layer {}, but the pool has {} layers", f.layer, g.total_layers()));
  if (f.tensor >= g.tensors_per_layer())
    return make_error(Errc::kInvalidArgument,
                      fmt::format("frame for tensor {}, but the pool has {} tensors per layer",
                                  f.tensor, g.tensors_per_layer()));
  const auto tensor = static_cast<PoolTensor>(f.tensor);
  const uint64_t block = g.block_bytes(tensor);
  const uint64_t size = g.tensor_bytes(f.layer, tensor);
  const uint64_t head = block / g.kv_heads;
  const bool whole_blocks = block != 0 && f.dst_offset % block == 0 && f.bytes % block == 0;
  // Heterogeneous TP: whole heads of one block.
  const bool heads_of_a_block = head != 0 && f.dst_offset % head == 0 && f.bytes % head == 0 &&
                                f.dst_offset % block + f.bytes <= block;
  if (f.bytes == 0 || block == 0 || !(whole_blocks || heads_of_a_block))
    return make_error(Errc::kInvalidArgument,
                      fmt::format("frame of {} bytes at offset {} is neither whole blocks of {} "
                                  "bytes nor whole heads of {} bytes within one block",
                                  f.bytes, f.dst_offset, block, head));
  if (f.dst_offset > size || f.bytes > size - f.dst_offset)
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("frame writes destination blocks {}..{} of layer {}, but the pool has {} "
                    "blocks there",
                    f.dst_offset / block, (f.dst_offset + f.bytes - 1) / block, f.layer,
                    g.blocks_in_layer(f.layer)));
  return {};
}

HeadLayout sender_layout(const Hello& hello) {
  return HeadLayout{hello.tp_size, hello.pool.kv_heads,
                    hello.total_kv_heads != 0 ? hello.total_kv_heads
                                              : hello.pool.kv_heads * hello.tp_size};
}

Status check_hello(const Hello& hello, const std::string& instance, const PoolGeometry& local,
                   const std::optional<HeadLayout>& heads) {
  if (hello.version != kWireVersion)
    return make_error(
        Errc::kVersionMismatch,
        fmt::format("wire protocol version {} here, {} at the peer", kWireVersion, hello.version));
  if (!hello.expected_instance.empty() && hello.expected_instance != instance)
    return make_error(Errc::kInvalidArgument, fmt::format("this is instance '{}', not '{}'",
                                                          instance, hello.expected_instance));
  if (!heads) return check_compatible(local, hello.pool);
  const HeadLayout theirs = sender_layout(hello);
  if (Status s = theirs.check(); !s)
    return make_error(Errc::kLayoutMismatch, fmt::format("the peer's heads: {}", s.error().message));
  return check_compatible(local, *heads, hello.pool, theirs);
}

}  // namespace kvrelay::worker::tcp
