// The rdma transport's control messages (schemas/kvrelay.capnp,
// RdmaMessage), as TransportMessages of protocol kProtocol on a net/
// connection:
//   <- offer(queue pairs)                  after the helloAck
//   -> accept(queue pairs, regions | reason)
//   <- intent(transfer, queue pair, blocks) ...  before its writes
//   -> grant(transfer, rkeys | reason) ...       only then are they posted
//   -> ack(transfer, ok | reason)          its WRITE_WITH_IMM has landed
// Plain functions of bytes, so the fuzzer drives what a socket does.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "instance/pool_geometry.h"
#include "shm/result.h"
#include "worker/net/envelope.h"
#include "worker/rdma/endpoint_codec.h"

namespace kvrelay::worker::rdma {

// TransportMessage.protocol of rdma's messages (the registry keeps them apart).
inline constexpr uint8_t kProtocol = 2;

inline constexpr size_t kMaxQueuePairs = 16;
// Runs per intent part: keeps every part, and its grant part (a key per run
// and tensor), far below net::kMaxEnvelopeBytes.
inline constexpr size_t kMaxIntentRuns = 2048;
inline constexpr size_t kMaxGrantKeys = kMaxIntentRuns * 4;  // K, V and their scales
// The slowest rate either side allows granted writes to land at, for their
// deadlines: 16 MiB/s (soft-RoCE in a VM moves about 50 MB/s). A peer that
// holds a grant is cut no later than this allows, and at once when the
// grant's request is withdrawn.
inline constexpr uint64_t kMinRateBytesPerSecond = 16ull << 20;

struct BlockSpan {
  uint32_t first = 0;
  uint32_t count = 0;
};

struct Intent {
  uint64_t transfer = 0;
  uint64_t request_key = 0;
  uint64_t handle = 0;
  uint32_t layer = 0;
  std::vector<BlockSpan> runs;  // destination blocks
  bool last = true;
  // Heterogeneous TP: only these heads of each block (heads 0: whole blocks).
  uint32_t first_head = 0;
  uint32_t heads = 0;
  // The offered queue pair its writes go on: the grant's keys serve it alone.
  uint32_t queue_pair = 0;
};

struct Accept {
  bool accepted = false;
  std::string reason;
  std::vector<QpEndpoint> queue_pairs;
  std::vector<RegionEntry> regions;  // unchecked: check_regions
};

// One part of a grant: the answer to the intent part of the same place.
struct Grant {
  uint64_t transfer = 0;
  bool ok = false;
  std::string reason;
  // Per run of the intent part, a key per tensor of the layer (in their
  // order in a layer): what writes that run's blocks of that tensor.
  std::vector<uint32_t> rkeys;
  bool last = true;
};

// An ack.
struct Answer {
  uint64_t transfer = 0;
  bool ok = false;
  std::string reason;
};

struct Message {
  enum class Kind { kOffer, kAccept, kIntent, kGrant, kAck } kind = Kind::kOffer;
  std::vector<QpEndpoint> offer;  // each checked (endpoint_codec.h)
  Accept accept;
  Intent intent;
  Grant grant;
  Answer answer;  // ack
};
Result<Message> decode(const net::Inbound& in);

void encode_offer(std::span<const QpEndpoint> queue_pairs, std::vector<std::byte>& out);
// `tensors` as encode_regions() takes them; ignored when refused.
void encode_accept(bool accepted, const std::string& reason,
                   std::span<const QpEndpoint> queue_pairs, const PoolGeometry& geometry,
                   const std::vector<RemoteTensor>& tensors, std::vector<std::byte>& out);
// One part of an intent: `runs` holds at most kMaxIntentRuns spans.
void encode_intent(const Intent& intent, std::vector<std::byte>& out);
// One part of a grant: `grant.rkeys` holds at most kMaxGrantKeys.
void encode_grant(const Grant& grant, std::vector<std::byte>& out);
void encode_ack(uint64_t transfer, bool ok, const std::string& reason, std::vector<std::byte>& out);

}  // namespace kvrelay::worker::rdma
