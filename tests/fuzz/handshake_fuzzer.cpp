// libFuzzer target: both halves of a connection's handshake (server_auth.h,
// client_auth.h) against a hostile other end. The listener's half meets
// whatever a connecting peer sends before and just after its proof; the
// connecting worker's half meets whatever a listener (or something posing
// as one at the decode instance's address) sends. The input's first byte
// picks the half, the protection mode, and whether the peer holds the key:
// such a peer's proofs are made valid here, so the fuzzer gets past them
// and explores what a keyed but hostile peer may send next (the hello, the
// helloAck, heartbeats, repeats, messages after the handshake). The rest is
// the stream: length prefixes and envelopes, decoded as a channel does
// (parse_length, decode_envelope). The tcp_wire fuzzer covers what follows
// the handshake. A crash, a sanitizer report, a hang or a leak is a finding.
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "fuzz_geometry.h"
#include "instance/auth_key.h"
#include "worker/net/client_auth.h"
#include "worker/net/envelope.h"
#include "worker/net/hello.h"
#include "worker/net/server_auth.h"

namespace {

using namespace kvrelay;
using namespace kvrelay::worker::net;

const AuthKey& fuzz_key() {
  static const AuthKey key =
      AuthKey::from_bytes({0x6b, 0x76, 0x72, 0x65, 0x6c, 0x61, 0x79, 0x2d, 0x66, 0x75, 0x7a,
                           0x7a, 0x2d, 0x6b, 0x65, 0x79, 0x13, 0x37, 0xc0, 0xde, 0x42, 0x99,
                           0xa5, 0x5a, 0x01, 0xfe, 0x77, 0x88, 0x3c, 0xd2, 0x4e, 0xb1});
  return key;
}

// The one envelope of a message this side encoded (its first), decoded.
std::optional<Inbound> first_envelope(const std::vector<std::byte>& bytes) {
  if (bytes.size() < 4) return std::nullopt;
  Result<uint32_t> len =
      parse_length(std::span<const uint8_t, 4>(reinterpret_cast<const uint8_t*>(bytes.data()), 4));
  if (!len || bytes.size() - 4 < *len) return std::nullopt;
  std::vector<uint64_t> body(*len / 8 + 1, 0);
  std::memcpy(body.data(), bytes.data() + 4, *len);
  Result<Inbound> in = decode_envelope(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(body.data()), *len));
  if (!in) return std::nullopt;
  return std::move(in).value();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t control = data[0];
  const bool listener = (control & 1) != 0;
  const Protection mode = (control & 2) != 0 ? Protection::kEncrypt : Protection::kAuthenticate;
  const bool peer_holds_key = (control & 4) != 0;
  const uint8_t modes[1] = {static_cast<uint8_t>(mode)};
  const AuthKey& key = fuzz_key();

  ServerHandshake server(key, mode);
  static const PoolGeometry g = fuzz::fuzz_geometry();
  ClientHandshake client(key, mode, make_hello("fuzz-p", "fuzz-d", 0, 1, g));
  std::vector<uint8_t> server_nonce;  // the listener's challenge, as the other side saw it
  std::vector<uint8_t> client_nonce;  // the connecting side's, from its proof
  if (listener) {
    std::vector<std::byte> challenge;
    server.challenge(challenge);
    const std::optional<Inbound> c = first_envelope(challenge);
    if (!c) abort();  // this side's own challenge must decode
    server_nonce = c->nonce;
  }

  std::vector<uint64_t> body;
  size_t at = 1;
  while (size - at >= 4) {
    Result<uint32_t> len = parse_length(std::span<const uint8_t, 4>(data + at, 4));
    at += 4;
    if (!len || size - at < *len) return 0;  // the channel closes here
    body.assign(*len / 8 + 1, 0);
    std::memcpy(body.data(), data + at, *len);
    at += *len;
    Result<Inbound> in = decode_envelope(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(body.data()), *len));
    if (!in) return 0;
    if (peer_holds_key) {
      // A peer with the key computes the proof it is asked for (over
      // whatever nonce it sent): made here, so the fuzzer need not.
      if (listener && in->kind == schema::NetEnvelope::PROOF) {
        const Mac m = key.mac(kConnectLabel, {server_nonce, in->nonce, modes});
        in->mac.assign(m.begin(), m.end());
      } else if (!listener && in->kind == schema::NetEnvelope::SERVER_PROOF) {
        const Mac m = key.mac(kAcceptLabel, {client_nonce, server_nonce, modes});
        in->mac.assign(m.begin(), m.end());
      }
    }
    if (!listener && in->kind == schema::NetEnvelope::CHALLENGE) server_nonce = in->nonce;
    Result<HandshakeStep> step = listener ? server.on_message(*in) : client.on_message(*in);
    if (!step) return 0;  // refused: the channel closes
    if (!listener && !step->send_plain.empty()) {
      // The connecting side's proof: its nonce is what the listener's proof covers.
      if (const std::optional<Inbound> proof = first_envelope(step->send_plain))
        client_nonce = proof->nonce;
    }
    // Whatever a step sends must itself be a well-formed message.
    if (!step->send_plain.empty() && !first_envelope(step->send_plain)) abort();
    if (!step->send_sealed.empty() && !first_envelope(step->send_sealed)) abort();
    if (listener && server.hello()) (void)check_hello(*server.hello(), "fuzz-d", g);
  }
  return 0;
}
