// The stream every network transport's connection carries (schemas/
// kvrelay.capnp, NetEnvelope): each message is a little-endian UInt32 length
// and a Cap'n Proto NetEnvelope of that many bytes. net/ reads the
// handshake's envelopes itself and passes a transport's own messages
// (TransportMessage: protocol, kind, body) to the handler that transport
// registered, unread. Once the session's keys exist (session_seal.h), each
// envelope, and each payload a transport sends after one, is followed by a
// 16-byte tag. Everything here is a plain function of bytes, so the fuzzers
// drive exactly what a socket does.
#pragma once

#include <capnp/message.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "instance/auth_key.h"
#include "schemas/codec.h"
#include "schemas/kvrelay.capnp.h"
#include "shm/result.h"
#include "worker/net/hello.h"
#include "worker/net/protection.h"

namespace kvrelay::worker::net {

// No message comes near this; a larger length means the stream is not a
// kvrelay peer's (or lost its framing).
inline constexpr uint32_t kMaxEnvelopeBytes = 64 * 1024;
// Texts a peer sends (reasons, names) are cut to this.
inline constexpr size_t kMaxTextBytes = 1024;

// One decoded envelope. The handshake's fields are copied out; a transport
// message's body stays in the receive buffer: `body` (the whole envelope)
// is valid until the handler calls read_next() or returns without reading a
// payload, and is read with with_body().
struct Inbound {
  schema::NetEnvelope::Which kind = schema::NetEnvelope::HEARTBEAT;
  std::vector<uint8_t> nonce;  // challenge, proof
  std::vector<uint8_t> mac;    // proof, serverProof
  uint8_t mode = 0;            // challenge, proof: Protection
  Hello hello;
  HelloAck hello_ack;
  uint8_t protocol = 0;  // message
  uint16_t message_kind = 0;
  std::span<const std::byte> body;
};

// The length prefix: ok, or why the stream cannot be a peer's.
Result<uint32_t> parse_length(std::span<const uint8_t, 4> prefix);
// Decodes an envelope (8-byte aligned, `length` bytes) with tight traversal
// and nesting limits; texts are capped.
Result<Inbound> decode_envelope(std::span<const std::byte> envelope);
// How many words a reader may traverse in one envelope: four times the
// largest envelope. Reading a field traverses it again (a message is checked,
// then applied), so a limit of once its size refused the largest rdma
// intents (4,096 runs) when they were read the second time: a 128k-token
// request lost its session ("Exceeded message traversal limit"). Four times
// still bounds what a hostile peer can make a reader walk.
inline constexpr uint64_t kEnvelopeTraversalWords = 4 * (kMaxEnvelopeBytes / 8);

// A transport message's body as a T, handed to `fn` (a Status or Result):
// any capnp error inside is kCorrupt, naming T.
template <class T, class Fn>
auto with_body(const Inbound& in, Fn&& fn) -> decltype(fn(std::declval<typename T::Reader>())) {
  messages::ReadLimits limits;
  limits.traversal_words = kEnvelopeTraversalWords;
  limits.nesting = 8;
  return messages::with_message<schema::NetEnvelope>(
      in.body,
      [&](schema::NetEnvelope::Reader e) { return fn(e.getMessage().getBody().getAs<T>()); },
      limits);
}

// Encoders append one whole message (prefix and envelope) to `out`.
void encode_challenge(const Nonce& nonce, Protection mode, std::vector<std::byte>& out);
void encode_proof(const Nonce& nonce, Protection mode, const Mac& mac, std::vector<std::byte>& out);
void encode_server_proof(const Mac& mac, std::vector<std::byte>& out);
void encode_hello(const Hello& hello, std::vector<std::byte>& out);
void encode_hello_ack(const HelloAck& ack, std::vector<std::byte>& out);
void encode_heartbeat(std::vector<std::byte>& out);
// A transport's message: initialises `message` as a NetEnvelope carrying
// one, and returns its body for the transport to fill; append_envelope()
// then writes it.
capnp::AnyPointer::Builder init_message(capnp::MessageBuilder& message, uint8_t protocol,
                                        uint16_t kind);
// Appends `message` (a NetEnvelope) with its length prefix.
void append_envelope(capnp::MessageBuilder& message, std::vector<std::byte>& out);

}  // namespace kvrelay::worker::net
