// The tcp transport's own messages (schemas/kvrelay.capnp, TcpMessage), as
// TransportMessages of protocol kProtocol on a net/ connection:
//   <- frame(transfer, handle, layer, tensor, offset | runs, bytes, last) + payload ...
//   -> ack(transfer, ok | reason)   after the transfer's last payload is in the pool
// A frame of several runs carries their bytes back to back as one payload
// (one record, one tag), each run landing at its own offset.
// Plain functions of bytes, so the fuzzer drives what a socket does.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "instance/pool_geometry.h"
#include "shm/result.h"
#include "worker/net/envelope.h"

namespace kvrelay::worker::tcp {

// TransportMessage.protocol of tcp's messages (the registry keeps them apart).
inline constexpr uint8_t kProtocol = 1;

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

// One run of a frame of several: `bytes` bytes landing at `dst_offset`.
struct FrameRun {
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
};
// A receiver takes at most this many runs in one frame (a sender groups
// fewer, kGroupRuns in frame_plan.h); with their envelope it stays far below
// net::kMaxEnvelopeBytes.
inline constexpr size_t kMaxFrameRuns = 1024;

struct Ack {
  uint64_t transfer = 0;
  bool ok = false;
  std::string reason;
};

// One message of tcp's, decoded.
struct Message {
  enum class Kind { kFrame, kAck } kind = Kind::kFrame;
  FrameHeader frame;
  // A frame of several runs: its runs, which sum to frame.bytes (its
  // dst_offset is 0). Empty: the payload lands at frame.dst_offset.
  std::vector<FrameRun> runs;
  Ack ack;
};
// Refuses a frame whose runs are too many, empty, do not sum to its bytes,
// or come with a dstOffset.
Result<Message> decode(const net::Inbound& in);

// `runs` empty: a frame of one run (frame.dst_offset, frame.bytes); else
// frame.bytes must be their sum and frame.dst_offset 0.
void encode_frame(const FrameHeader& frame, std::span<const FrameRun> runs,
                  std::vector<std::byte>& out);
inline void encode_frame(const FrameHeader& frame, std::vector<std::byte>& out) {
  encode_frame(frame, {}, out);
}
// Each run of `frame` as a frame of its own would be (the header's fields,
// the run's offset and bytes; `last` only on the final one), to check and
// count it alone.
std::vector<FrameHeader> frame_parts(const FrameHeader& frame, std::span<const FrameRun> runs);
void encode_ack(uint64_t transfer, bool ok, const std::string& reason, std::vector<std::byte>& out);

// Whether a frame may be written into a pool of geometry `g`: its layer and
// tensor exist, and its bytes are whole blocks inside the tensor, or whole
// heads within one block (heterogeneous TP). The error says which check
// failed, with the frame's and the pool's values.
Status check_frame(const FrameHeader& frame, const PoolGeometry& g);

}  // namespace kvrelay::worker::tcp
