#include "worker/net/envelope.h"

#include <fmt/format.h>

#include <cstring>

#include "schemas/pool_descriptor.h"

namespace kvrelay::worker::net {

namespace {

std::string capped(capnp::Text::Reader t) {
  return std::string(t.cStr(), std::min<size_t>(t.size(), kMaxTextBytes));
}

std::vector<uint8_t> bytes_of(capnp::Data::Reader d, size_t max) {
  if (d.size() > max) return {};
  return std::vector<uint8_t>(d.begin(), d.end());
}

}  // namespace

void append_envelope(capnp::MessageBuilder& message, std::vector<std::byte>& out) {
  const size_t body = messages::encoded_bytes(message);
  const size_t at = out.size();
  out.resize(at + 4 + body);
  const auto len = static_cast<uint32_t>(body);
  const uint8_t prefix[4] = {static_cast<uint8_t>(len), static_cast<uint8_t>(len >> 8),
                             static_cast<uint8_t>(len >> 16), static_cast<uint8_t>(len >> 24)};
  std::memcpy(out.data() + at, prefix, 4);
  messages::encode_into(message, std::span<std::byte>(out.data() + at + 4, body));
}

Result<uint32_t> parse_length(std::span<const uint8_t, 4> p) {
  const uint32_t len =
      uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
  if (len == 0 || len % 8 != 0 || len > kMaxEnvelopeBytes)
    return make_error(Errc::kCorrupt,
                      fmt::format("a message of {} bytes is not a kvrelay envelope (whole 8-byte "
                                  "words, at most {} bytes)",
                                  len, kMaxEnvelopeBytes));
  return len;
}

Result<Inbound> decode_envelope(std::span<const std::byte> envelope) {
  messages::ReadLimits limits;
  limits.traversal_words = kEnvelopeTraversalWords;
  limits.nesting = 8;
  return messages::with_message<schema::NetEnvelope>(
      envelope,
      [&](schema::NetEnvelope::Reader e) -> Result<Inbound> {
        Inbound in;
        in.kind = e.which();
        switch (in.kind) {
          case schema::NetEnvelope::CHALLENGE:
            in.nonce = bytes_of(e.getChallenge().getNonce(), kNonceBytes);
            in.mode = e.getChallenge().getMode();
            break;
          case schema::NetEnvelope::PROOF:
            in.nonce = bytes_of(e.getProof().getNonce(), kNonceBytes);
            in.mode = e.getProof().getMode();
            in.mac = bytes_of(e.getProof().getMac(), kMacBytes);
            break;
          case schema::NetEnvelope::SERVER_PROOF:
            in.mac = bytes_of(e.getServerProof().getMac(), kMacBytes);
            break;
          case schema::NetEnvelope::HELLO: {
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
          case schema::NetEnvelope::HELLO_ACK: {
            const auto a = e.getHelloAck();
            in.hello_ack.accepted = a.getAccepted();
            in.hello_ack.reason = capped(a.getReason());
            in.hello_ack.pool = messages::shape_of(a.getPool());
            in.hello_ack.epoch = a.getEpoch();
            in.hello_ack.tp_size = a.getTpSize();
            in.hello_ack.total_kv_heads = a.getTotalKvHeads();
            break;
          }
          case schema::NetEnvelope::HEARTBEAT: break;
          case schema::NetEnvelope::MESSAGE:
            in.protocol = e.getMessage().getProtocol();
            in.message_kind = e.getMessage().getKind();
            in.body = envelope;
            break;
          default:
            return make_error(Errc::kCorrupt, "an envelope of a kind this version does not know");
        }
        return in;
      },
      limits);
}

void encode_challenge(const Nonce& nonce, Protection mode, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(64);
  auto c = m.initRoot<schema::NetEnvelope>().initChallenge();
  c.setNonce(kj::arrayPtr(nonce.data(), nonce.size()));
  c.setMode(static_cast<uint8_t>(mode));
  append_envelope(m, out);
}

void encode_proof(const Nonce& nonce, Protection mode, const Mac& mac,
                  std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(64);
  auto p = m.initRoot<schema::NetEnvelope>().initProof();
  p.setNonce(kj::arrayPtr(nonce.data(), nonce.size()));
  p.setMode(static_cast<uint8_t>(mode));
  p.setMac(kj::arrayPtr(mac.data(), mac.size()));
  append_envelope(m, out);
}

void encode_server_proof(const Mac& mac, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(32);
  m.initRoot<schema::NetEnvelope>().initServerProof().setMac(kj::arrayPtr(mac.data(), mac.size()));
  append_envelope(m, out);
}

void encode_hello(const Hello& hello, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(128);
  auto h = m.initRoot<schema::NetEnvelope>().initHello();
  h.setProtocolVersion(hello.version);
  h.setInstance(hello.instance);
  h.setExpectedInstance(hello.expected_instance);
  h.setRank(hello.rank);
  h.setTpSize(hello.tp_size);
  h.setTotalKvHeads(hello.total_kv_heads);
  messages::set_shape(h.initPool(), hello.pool);
  append_envelope(m, out);
}

void encode_hello_ack(const HelloAck& ack, std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(128);
  auto a = m.initRoot<schema::NetEnvelope>().initHelloAck();
  a.setAccepted(ack.accepted);
  a.setReason(ack.reason.substr(0, kMaxTextBytes));
  messages::set_shape(a.initPool(), ack.pool);
  a.setEpoch(ack.epoch);
  a.setTpSize(ack.tp_size);
  a.setTotalKvHeads(ack.total_kv_heads);
  append_envelope(m, out);
}

void encode_heartbeat(std::vector<std::byte>& out) {
  capnp::word scratch[4] = {};
  capnp::MallocMessageBuilder m(kj::arrayPtr(scratch, 4));
  m.initRoot<schema::NetEnvelope>().setHeartbeat();
  append_envelope(m, out);
}

capnp::AnyPointer::Builder init_message(capnp::MessageBuilder& message, uint8_t protocol,
                                        uint16_t kind) {
  auto msg = message.initRoot<schema::NetEnvelope>().initMessage();
  msg.setProtocol(protocol);
  msg.setKind(kind);
  return msg.getBody();
}

}  // namespace kvrelay::worker::net
