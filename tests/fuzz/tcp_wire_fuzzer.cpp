// libFuzzer target: a listener's receiving side, as the stream a peer that
// holds the key may write once the session is sealed (the seal itself only
// admits what such a peer wrote): length prefixes, envelopes and payloads,
// in any order. Each envelope is decoded exactly as a channel does
// (parse_length, decode_envelope); hellos are checked as the listener does
// (check_hello); transport messages go to their transport's decoder: tcp
// frames are checked against a pool geometry (check_frame) and their payload
// skipped as the receiver would read or drop it; rdma offers open a session
// (on the in-process fake fabric), intents go to that session's checks
// against the pool and the expected requests, accepts to check_regions.
// Anything may come back; a crash, a sanitizer report, a hang or a leak is a
// finding.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "../worker/fake_fabric.h"
#include "fuzz_geometry.h"
#include "instance/pool_segment.h"
#include "worker/net/envelope.h"
#include "worker/net/hello.h"
#include "worker/rdma/control_wire.h"
#include "worker/rdma/rdma_receiver.h"
#include "worker/tcp/frame_wire.h"

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
  std::vector<rdma::Grant> grants;  // sent once their windows are bound
  std::vector<uint64_t> body;
  size_t at = 0;
  while (size - at >= 4) {
    Result<uint32_t> len = worker::net::parse_length(std::span<const uint8_t, 4>(data + at, 4));
    at += 4;
    if (!len || size - at < *len) return 0;  // the channel closes here
    body.assign(*len / 8, 0);
    std::memcpy(body.data(), data + at, *len);
    at += *len;
    Result<worker::net::Inbound> in = worker::net::decode_envelope(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(body.data()), *len));
    if (!in) return 0;
    if (in->kind == kvrelay::schema::NetEnvelope::HELLO) {
      (void)worker::net::check_hello(in->hello, "fuzz", g);
      continue;
    }
    if (in->kind != kvrelay::schema::NetEnvelope::MESSAGE) continue;
    if (in->protocol == kProtocol) {
      Result<Message> m = decode(*in);
      if (!m) return 0;
      if (m->kind == Message::Kind::kFrame) {
        // As the receiver does: each run checked as a frame of its own.
        for (const FrameHeader& part : frame_parts(m->frame, m->runs))
          (void)check_frame(part, g);
        if (m->frame.bytes > size - at) return 0;
        at += m->frame.bytes;
      }
    } else if (in->protocol == rdma::kProtocol) {
      Result<rdma::Message> m = rdma::decode(*in);
      if (!m) return 0;
      if (m->kind == rdma::Message::Kind::kOffer) {
        if (session) return 0;  // a second offer closes the connection
        Result<std::unique_ptr<rdma::RdmaSession>> s =
            rdma::RdmaSession::accept(*side.listener, *side.arrivals, m->offer, "fuzz", "p0");
        if (s) session = std::move(s).value();
      } else if (m->kind == rdma::Message::Kind::kIntent) {
        if (!session) return 0;                        // closed: an intent before an offer
        if (!session->on_intent(m->intent)) return 0;  // closed: broke the protocol
        if (!session->poll(acks, grants)) return 0;
      } else if (m->kind == rdma::Message::Kind::kAccept) {
        (void)rdma::check_regions(m->accept.regions, g);
      }
    } else {
      return 0;  // a protocol the listener does not serve: closed
    }
  }
  return 0;
}
