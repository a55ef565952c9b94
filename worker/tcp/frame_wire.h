// The tcp transport's own messages (schemas/kvrelay.capnp, TcpMessage), as
// TransportMessages of protocol kProtocol on a net/ connection:
//   <- frame(transfer, handle, layer, tensor, offset, bytes, last) + payload ...
//   -> ack(transfer, ok | reason)   after the transfer's last payload is in the pool
// Plain functions of bytes, so the fuzzer drives what a socket does.
#pragma once

#include <cstdint>
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

struct Ack {
  uint64_t transfer = 0;
  bool ok = false;
  std::string reason;
};

// One message of tcp's, decoded.
struct Message {
  enum class Kind { kFrame, kAck } kind = Kind::kFrame;
  FrameHeader frame;
  Ack ack;
};
Result<Message> decode(const net::Inbound& in);

void encode_frame(const FrameHeader& frame, std::vector<std::byte>& out);
void encode_ack(uint64_t transfer, bool ok, const std::string& reason, std::vector<std::byte>& out);

// Whether a frame may be written into a pool of geometry `g`: its layer and
// tensor exist, and its bytes are whole blocks inside the tensor, or whole
// heads within one block (heterogeneous TP). The error says which check
// failed, with the frame's and the pool's values.
Status check_frame(const FrameHeader& frame, const PoolGeometry& g);

}  // namespace kvrelay::worker::tcp
