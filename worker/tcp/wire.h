// The tcp transport's stream (schemas/kvrelay.capnp, TcpEnvelope): every
// message is a little-endian UInt32 length and a Cap'n Proto TcpEnvelope of
// that many bytes; a frame's payload follows its envelope. Everything here is
// a plain function of bytes, so the fuzzer drives exactly what a socket does.
//
// The connection, from the accepting (decode) side's view:
//   -> challenge(nonce_s)
//   <- proof(nonce_c, HMAC(key, connect-label, nonce_s, nonce_c))   refused: closed, logged
//   <- hello(version, instance, rank, tp, pool geometry, instance expected)
//   -> helloAck(accepted | reason, pool geometry, epoch,
//               HMAC(key, accept-label, nonce_c, nonce_s))
//   <- frame(transfer, handle, layer, tensor, offset, bytes, last) + payload ...
//   -> ack(transfer, ok | reason)           after the transfer's last payload is in the pool
//   <> heartbeat                            both ways, whenever the line is quiet
#pragma once

#include <capnp/message.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "instance/auth_key.h"
#include "instance/head_layout.h"
#include "instance/pool_geometry.h"
#include "schemas/kvrelay.capnp.h"
#include "shm/result.h"
#include "worker/rdma/endpoint_codec.h"
#include "worker/request_key.h"

namespace kvrelay::worker::tcp {

inline constexpr uint32_t kWireVersion = 1;
// No control message comes near this; a larger length means the stream is
// not a kvrelay peer's (or lost its framing).
inline constexpr uint32_t kMaxEnvelopeBytes = 64 * 1024;

struct FrameHeader {
  uint64_t transfer = 0;
  uint64_t request_key = 0;  // request_key() of its request id; 0: unnamed
  uint64_t handle = 0;
  uint32_t layer = 0;
  uint32_t tensor = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
  bool last = false;
};

struct Hello {
  uint32_t version = 0;
  std::string instance;           // the connecting side's
  std::string expected_instance;  // the instance it means to reach; empty: any
  uint32_t rank = 0;
  uint32_t tp_size = 0;
  uint32_t total_kv_heads = 0;  // 0: pool.kv_heads x tp_size
  PoolGeometry pool;
};

struct HelloAck {
  bool accepted = false;
  std::string reason;
  PoolGeometry pool;
  uint64_t epoch = 0;
  std::vector<uint8_t> proof;
  uint32_t tp_size = 0;  // the accepting instance's; 0: unknown
  uint32_t total_kv_heads = 0;
};

// The rdma transport's control messages (rdmaOffer .. rdmaGrant in the schema).
inline constexpr size_t kMaxRdmaQueuePairs = 16;
// Runs per RdmaIntent part: keeps every part far below kMaxEnvelopeBytes.
inline constexpr size_t kMaxIntentRuns = 4096;

struct BlockSpan {
  uint32_t first = 0;
  uint32_t count = 0;
};

struct RdmaIntent {
  uint64_t transfer = 0;
  uint64_t request_key = 0;
  uint64_t handle = 0;
  uint32_t layer = 0;
  std::vector<BlockSpan> runs;  // destination blocks
  bool last = true;
  // Heterogeneous TP: only these heads of each block (heads 0: whole blocks).
  uint32_t first_head = 0;
  uint32_t heads = 0;
};

struct RdmaAccept {
  bool accepted = false;
  std::string reason;
  std::vector<rdma::QpEndpoint> queue_pairs;
  std::vector<rdma::RegionEntry> regions;  // unchecked: rdma::check_regions
};

// One decoded envelope, copied out of the message (whose buffer is reused).
struct Inbound {
  schema::TcpEnvelope::Which kind = schema::TcpEnvelope::HEARTBEAT;
  std::vector<uint8_t> nonce;  // challenge, proof
  std::vector<uint8_t> mac;    // proof
  Hello hello;
  HelloAck hello_ack;
  FrameHeader frame;
  uint64_t ack_transfer = 0;  // ack, rdmaGrant
  bool ack_ok = false;
  std::string ack_reason;
  std::vector<rdma::QpEndpoint> rdma_offer;  // each checked (endpoint_codec.h)
  RdmaAccept rdma_accept;
  RdmaIntent rdma_intent;
};

// The length prefix: ok, or why the stream cannot be a peer's.
Result<uint32_t> parse_length(std::span<const uint8_t, 4> prefix);
// Decodes an envelope body (8-byte aligned, `length` bytes) with tight
// traversal and nesting limits; texts are capped.
Result<Inbound> decode_envelope(std::span<const std::byte> body);

// Encoders append one whole message (prefix and body) to `out`.
void encode_challenge(const Nonce& nonce, std::vector<std::byte>& out);
void encode_proof(const Nonce& nonce, const Mac& mac, std::vector<std::byte>& out);
void encode_hello(const Hello& hello, std::vector<std::byte>& out);
void encode_hello_ack(const HelloAck& ack, std::vector<std::byte>& out);
void encode_frame(const FrameHeader& frame, std::vector<std::byte>& out);
void encode_ack(uint64_t transfer, bool ok, const std::string& reason, std::vector<std::byte>& out);
void encode_heartbeat(std::vector<std::byte>& out);
void encode_rdma_offer(std::span<const rdma::QpEndpoint> queue_pairs, std::vector<std::byte>& out);
// `tensors` as encode_regions() takes them; ignored when refused.
void encode_rdma_accept(bool accepted, const std::string& reason,
                        std::span<const rdma::QpEndpoint> queue_pairs, const PoolGeometry& geometry,
                        const std::vector<rdma::RemoteTensor>& tensors,
                        std::vector<std::byte>& out);
// One part of an intent: `runs` holds at most kMaxIntentRuns spans.
void encode_rdma_intent(const RdmaIntent& intent, std::vector<std::byte>& out);
void encode_rdma_grant(uint64_t transfer, bool ok, const std::string& reason,
                       std::vector<std::byte>& out);

// Whether a frame may be written into a pool of geometry `g`: its layer and
// tensor exist, and its bytes are whole blocks inside the tensor, or whole
// heads within one block (heterogeneous TP). The error says which check
// failed, with the frame's and the pool's values.
Status check_frame(const FrameHeader& frame, const PoolGeometry& g);

// Why a peer's hello cannot be served by this side, or ok: version, the
// instance it expects, and the pool geometry (naming the field). `heads`:
// this instance's layout; with it, a sender of another TP size serving the
// same model heads is accepted (without: the pools must match exactly).
Status check_hello(const Hello& hello, const std::string& instance, const PoolGeometry& local,
                   const std::optional<HeadLayout>& heads = std::nullopt);

// The sender's layout as its hello describes it.
HeadLayout sender_layout(const Hello& hello);

}  // namespace kvrelay::worker::tcp
