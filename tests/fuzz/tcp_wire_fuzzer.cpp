// libFuzzer target: the tcp transport's receiving side, as a stream. The
// input is what a peer wrote on the socket: length prefixes, envelopes and
// payloads, in any order. Each envelope is decoded exactly as a channel does
// (parse_length, decode_envelope), and frames and hellos are checked against
// a pool geometry as the receiver does (check_frame, check_hello); a frame's
// payload is skipped as the receiver would read or drop it. The rdma control
// messages go where the receiver sends them: an offer opens an rdma session
// (on the in-process fake fabric), intents go to that session's checks
// against the pool and the expected requests, accepts to check_regions.
// Anything may come back; a crash, a sanitizer report, a hang or a leak is a
// finding.
#include <cstdint>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "../worker/fake_fabric.h"
#include "fuzz_geometry.h"
#include "instance/pool_segment.h"
#include "worker/rdma/rdma_receiver.h"
#include "worker/tcp/wire.h"

namespace {

using namespace kvrelay;
using namespace kvrelay::worker::tcp;
using fuzz::fuzz_geometry;
namespace rdma = kvrelay::worker::rdma;

// The receiving rank's side of rdma sessions, made once.
struct RdmaSide {
  RdmaSide() {
    spdlog::set_level(spdlog::level::off);
    const std::string name = fmt::format("kvrelay-fuzz-rdma-{}", getpid());
    (void)SharedSegment::unlink(name);
    Result<HostPool> p = HostPool::create(name, 0, PoolTier::kDevice, fuzz_geometry());
    if (!p) abort();
    (void)SharedSegment::unlink(name);  // gone with the process
    pool = std::make_unique<worker::HostSegmentPool>(std::move(p).value());
    arrivals = std::make_unique<worker::Arrivals>(pool->geometry(), nullptr);
    (void)arrivals->expect(1, "fuzz-declared", {3, 4, 5});
    listener = std::make_unique<rdma::RdmaListener>(&fabric, "", *pool, 0);
  }
  rdma::testing::FakeFabric fabric;
  std::unique_ptr<worker::HostSegmentPool> pool;
  std::unique_ptr<worker::Arrivals> arrivals;
  std::unique_ptr<rdma::RdmaListener> listener;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const PoolGeometry g = fuzz_geometry();
  static RdmaSide side;
  std::unique_ptr<rdma::RdmaSession> session;  // this stream's, as a connection holds it
  std::vector<rdma::Ack> acks;
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
    } else if (in->kind == kvrelay::schema::TcpEnvelope::RDMA_OFFER) {
      if (session) return 0;  // a second offer closes the connection
      Result<std::unique_ptr<rdma::RdmaSession>> s =
          rdma::RdmaSession::accept(*side.listener, *side.arrivals, in->rdma_offer, "fuzz");
      if (s) session = std::move(s).value();
    } else if (in->kind == kvrelay::schema::TcpEnvelope::RDMA_INTENT) {
      if (!session) return 0;  // closed: an intent before an offer
      if (!session->on_intent(in->rdma_intent)) return 0;  // closed: broke the protocol
      if (!session->poll(acks)) return 0;
    } else if (in->kind == kvrelay::schema::TcpEnvelope::RDMA_ACCEPT) {
      (void)rdma::check_regions(in->rdma_accept.regions, g);
    }
  }
  return 0;
}
