// libFuzzer target: the tcp transport's receiving side, as a stream. The
// input is what a peer wrote on the socket: length prefixes, envelopes and
// payloads, in any order. Each envelope is decoded exactly as a channel does
// (parse_length, decode_envelope), and frames and hellos are checked against
// a pool geometry as the receiver does (check_frame, check_hello); a frame's
// payload is skipped as the receiver would read or drop it. Anything may come
// back; a crash, a sanitizer report, a hang or a leak is a finding.
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_geometry.h"
#include "worker/tcp/wire.h"

namespace {

using namespace kvrelay;
using namespace kvrelay::worker::tcp;
using fuzz::fuzz_geometry;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const PoolGeometry g = fuzz_geometry();
  std::vector<uint64_t> body;
  size_t at = 0;
  while (size - at >= 4) {
    Result<uint32_t> len = parse_length(std::span<const uint8_t, 4>(data + at, 4));
    at += 4;
    if (!len || size - at < *len) return 0;  // the channel closes here
    body.assign(*len / 8, 0);
    std::memcpy(body.data(), data + at, *len);
    at += *len;
    Result<Inbound> in = decode_envelope(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(body.data()), *len));
    if (!in) return 0;
    if (in->kind == kvrelay::schema::TcpEnvelope::FRAME) {
      (void)check_frame(in->frame, g);
      if (in->frame.bytes > size - at) return 0;
      at += in->frame.bytes;
    } else if (in->kind == kvrelay::schema::TcpEnvelope::HELLO) {
      (void)check_hello(in->hello, "fuzz", g);
    }
  }
  return 0;
}
