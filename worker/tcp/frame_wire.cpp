#include "worker/tcp/frame_wire.h"

#include <fmt/format.h>

namespace kvrelay::worker::tcp {

namespace {
enum : uint16_t { kFrameKind = 0, kAckKind = 1 };
}  // namespace

Result<Message> decode(const net::Inbound& in) {
  return net::with_body<schema::TcpMessage>(
      in, [](schema::TcpMessage::Reader m) -> Result<Message> {
        Message out;
        switch (m.which()) {
          case schema::TcpMessage::FRAME: {
            const auto f = m.getFrame();
            out.kind = Message::Kind::kFrame;
            out.frame.transfer = f.getTransfer();
            out.frame.request_key = f.getRequestKey();
            out.frame.handle = f.getHandle();
            out.frame.layer = f.getLayer();
            out.frame.tensor = f.getTensor();
            out.frame.dst_offset = f.getDstOffset();
            out.frame.bytes = f.getBytes();
            out.frame.last = f.getLast();
            if (f.hasRuns()) {
              const auto runs = f.getRuns();
              if (runs.size() > kMaxFrameRuns)
                return make_error(Errc::kCorrupt, fmt::format("a tcp frame of {} runs (at most {})",
                                                              runs.size(), kMaxFrameRuns));
              if (out.frame.dst_offset != 0)
                return make_error(Errc::kCorrupt,
                                  "a tcp frame with both runs and a dstOffset of its own");
              uint64_t sum = 0;
              out.runs.reserve(runs.size());
              for (const auto r : runs) {
                if (r.getBytes() == 0 || r.getBytes() > out.frame.bytes - sum)
                  return make_error(
                      Errc::kCorrupt,
                      fmt::format("a tcp frame's run {} has {} bytes, with {} of the frame's {} "
                                  "left for it",
                                  out.runs.size(), r.getBytes(), out.frame.bytes - sum,
                                  out.frame.bytes));
                sum += r.getBytes();
                out.runs.push_back(FrameRun{r.getDstOffset(), r.getBytes()});
              }
              if (sum != out.frame.bytes)
                return make_error(Errc::kCorrupt,
                                  fmt::format("a tcp frame's runs sum to {} bytes, but it "
                                              "carries {}",
                                              sum, out.frame.bytes));
            }
            return out;
          }
          case schema::TcpMessage::ACK: {
            const auto a = m.getAck();
            out.kind = Message::Kind::kAck;
            out.ack.transfer = a.getTransfer();
            out.ack.ok = a.getOk();
            const auto reason = a.getReason();
            out.ack.reason.assign(reason.cStr(),
                                  std::min<size_t>(reason.size(), net::kMaxTextBytes));
            return out;
          }
        }
        return make_error(Errc::kCorrupt, "a tcp message of a kind this version does not know");
      });
}

void encode_frame(const FrameHeader& frame, std::span<const FrameRun> runs,
                  std::vector<std::byte>& out) {
  capnp::word scratch[24] = {};
  // One segment however many runs (2 words each, and the list's tag).
  capnp::MallocMessageBuilder m = runs.empty()
                                      ? capnp::MallocMessageBuilder(kj::arrayPtr(scratch, 24))
                                      : capnp::MallocMessageBuilder(32 + 2 * runs.size());
  auto f = net::init_message(m, kProtocol, kFrameKind).initAs<schema::TcpMessage>().initFrame();
  f.setTransfer(frame.transfer);
  f.setRequestKey(frame.request_key);
  f.setHandle(frame.handle);
  f.setLayer(frame.layer);
  f.setTensor(frame.tensor);
  f.setDstOffset(frame.dst_offset);
  f.setBytes(frame.bytes);
  f.setLast(frame.last);
  if (!runs.empty()) {
    auto list = f.initRuns(static_cast<unsigned>(runs.size()));
    for (size_t i = 0; i < runs.size(); ++i) {
      list[i].setDstOffset(runs[i].dst_offset);
      list[i].setBytes(runs[i].bytes);
    }
  }
  net::append_envelope(m, out);
}

std::vector<FrameHeader> frame_parts(const FrameHeader& frame, std::span<const FrameRun> runs) {
  if (runs.empty()) return {frame};
  std::vector<FrameHeader> parts(runs.size(), frame);
  for (size_t i = 0; i < runs.size(); ++i) {
    parts[i].dst_offset = runs[i].dst_offset;
    parts[i].bytes = runs[i].bytes;
    parts[i].last = frame.last && i + 1 == runs.size();
  }
  return parts;
}

void encode_ack(uint64_t transfer, bool ok, const std::string& reason,
                std::vector<std::byte>& out) {
  capnp::MallocMessageBuilder m(64);
  auto a = net::init_message(m, kProtocol, kAckKind).initAs<schema::TcpMessage>().initAck();
  a.setTransfer(transfer);
  a.setOk(ok);
  a.setReason(reason.substr(0, net::kMaxTextBytes));
  net::append_envelope(m, out);
}

Status check_frame(const FrameHeader& f, const PoolGeometry& g) {
  if (f.layer >= g.total_layers())
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("frame for layer {}, but the pool has {} layers", f.layer, g.total_layers()));
  if (!g.has_tensor_id(f.tensor)) {
    std::string has;
    for (uint32_t slot = 0; slot < g.tensors_per_layer(); ++slot)
      has += fmt::format("{}{}", slot == 0 ? "" : ", ", tensor_name(g.tensor_at(slot)));
    return make_error(Errc::kInvalidArgument,
                      fmt::format("frame for tensor {}, which the pool does not have (its tensors: "
                                  "{})",
                                  f.tensor, has));
  }
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

}  // namespace kvrelay::worker::tcp
