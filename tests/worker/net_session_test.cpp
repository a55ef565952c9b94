// The network session under a hostile peer (worker/net/): the key protects
// the session, not only the handshake. A relay without the key that forwards
// a real sender's handshake to a real listener (a separate process, on
// loopback) gets nothing it can use; a byte altered or injected in a keyed
// session, and a record replayed, close the connection before anything of
// them counts; nothing about the listener is said before the key is proved.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "raw_net_client.h"
#include "support/pool_patterns.h"
#include "support/processes.h"
#include "worker/receiver.h"
#include "worker/tcp/frame_wire.h"
#include "worker/tcp/tcp_transport.h"

namespace kvrelay::worker {
namespace {

using namespace std::chrono_literals;
using kvrelay::testing::RawNetClient;

PoolGeometry session_geometry() {
  return kvrelay::testing::transport_geometry();
}

class NetSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src = kvrelay::testing::make_test_pool("netsession", "src", session_geometry());
    dst = kvrelay::testing::make_test_pool("netsession", "dst", session_geometry());
    kvrelay::testing::fill(*src);
    ReceiverOptions o;
    o.instance = "d";
    o.timing.heartbeat = 20ms;
    o.timing.peer_timeout = 500ms;
    o.handshake_timeout = 1000ms;
    Result<std::unique_ptr<Receiver>> r = Receiver::start(net, *dst, key, o);
    ASSERT_TRUE(r) << r.error().message;
    receiver = std::move(r).value();
  }
  void TearDown() override {
    receiver.reset();
    for (auto* p : {src.get(), dst.get()})
      if (p != nullptr) (void)p->segment().unlink();
  }
  // A keyed session with the listener, its helloAck checked.
  std::unique_ptr<RawNetClient> session() {
    auto c = std::make_unique<RawNetClient>(receiver->port());
    Result<net::Inbound> ack = c->authenticate(key, RawNetClient::raw_hello(session_geometry()));
    EXPECT_TRUE(ack && ack->hello_ack.accepted)
        << (ack ? ack->hello_ack.reason : ack.error().message);
    return c;
  }
  // A frame of one whole block (block 3 of layer 0, K), encoded.
  std::vector<std::byte> frame(uint64_t transfer, tcp::FrameHeader* header = nullptr) {
    tcp::FrameHeader f;
    f.transfer = transfer;
    f.dst_offset = 3 * session_geometry().block_bytes(PoolTensor::kKey);
    f.bytes = session_geometry().block_bytes(PoolTensor::kKey);
    f.last = true;
    if (header != nullptr) *header = f;
    std::vector<std::byte> out;
    tcp::encode_frame(f, out);
    return out;
  }
  // Whether block 3 of layer 0's K still holds nothing.
  bool untouched() const {
    const uint64_t block = session_geometry().block_bytes(PoolTensor::kKey);
    const std::byte* p = dst->tensor(0, PoolTensor::kKey) + 3 * block;
    return std::all_of(p, p + block, [](std::byte b) { return b == std::byte{0}; });
  }
  // Reads until the listener closes (true) or sends something (false).
  static bool closed_by_listener(RawNetClient& c) {
    Result<net::Inbound> in = c.read();
    return !in;
  }

  AuthKey key = AuthKey::from_bytes(std::vector<uint8_t>(32, 7));
  std::unique_ptr<HostSegmentPool> src, dst;
  net::NetThread net;
  std::unique_ptr<Receiver> receiver;
};

// A keyless attacker the sender was pointed at (by CacheDest or DNS) relays
// the handshake both ways to the real listener, then sends its own frame on
// the connection it now holds. The listener must close it and write nothing:
// without the session's keys the attacker's records fail their tags.
TEST_F(NetSessionTest, AKeylessRelayOfTheHandshakeGetsNothingItCanUse) {
  const int front = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(front, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(front, 4), 0);
  socklen_t len = sizeof(a);
  ::getsockname(front, reinterpret_cast<sockaddr*>(&a), &len);
  const uint16_t relay_port = ntohs(a.sin_port);
  const uint16_t real_port = receiver->port();
  std::vector<std::byte> attack = frame(1);
  attack.resize(attack.size() + net::kTagBytes + session_geometry().block_bytes(PoolTensor::kKey) +
                    net::kTagBytes,
                std::byte{0x41});
  kvrelay::testing::SharedRegion verdict(sizeof(int));
  // The attacker: a process of its own, holding no key.
  const pid_t relay = kvrelay::testing::fork_child([&] {
    const int victim = ::accept(front, nullptr, nullptr);
    RawNetClient upstream(real_port);
    const int listener = upstream.socket().native_handle();
    // Moves one message (length prefix, envelope and, once sealed, its tag).
    auto pass = [](int from, int to, bool sealed) {
      uint8_t p[4];
      if (::recv(from, p, 4, MSG_WAITALL) != 4) return false;
      const size_t n =
          (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24) +
          (sealed ? net::kTagBytes : 0);
      std::vector<char> body(n);
      if (::recv(from, body.data(), n, MSG_WAITALL) != static_cast<ssize_t>(n)) return false;
      return ::send(to, p, 4, 0) == 4 && ::send(to, body.data(), n, 0) == static_cast<ssize_t>(n);
    };
    const bool relayed = pass(listener, victim, false)     // challenge
                         && pass(victim, listener, false)  // proof
                         && pass(listener, victim, false)  // server proof
                         && pass(victim, listener, true)   // hello, sealed
                         && pass(listener, victim, true);  // helloAck, sealed
    if (!relayed) return 2;
    // The connection to the listener is the attacker's now: its own frame.
    upstream.write_raw(attack);
    *verdict.as<int>() = closed_by_listener(upstream) ? 1 : 0;
    ::close(victim);
    return 0;
  });
  ::close(front);
  tcp::SenderOptions so;
  so.instance = "p";
  so.lanes = 1;
  so.timing.heartbeat = 20ms;
  so.timing.peer_timeout = 500ms;
  tcp::TcpTransport sender(net, *src, &key, so, nullptr);
  auto dest = kvrelay::testing::loopback_tcp_destination(sender, {relay_port});
  // The sender's own transfer goes nowhere (the relay stopped forwarding it).
  (void)kvrelay::testing::send_all_layers(sender, *dest, 1, 1, {1}, {1});
  const std::optional<kvrelay::testing::ChildExit> exit = kvrelay::testing::wait_child(relay, 10s);
  ASSERT_TRUE(exit && exit->exited && exit->code == 0) << "the relay passed the handshake";
  EXPECT_EQ(*verdict.as<int>(), 1) << "the listener closed the attacker's connection";
  EXPECT_TRUE(untouched());
  EXPECT_EQ(receiver->frames().frames.load(), 0u) << "no frame of the attacker was admitted";
}

// A keyed session whose payload bytes change on the way: the tag fails, the
// connection closes, and the transfer is never acked.
// A listener that does not serve tcp frames (a decode rank with rdma but
// not tcp in --protocol) closes a keyed peer's connection at its first
// frame, naming the protocol, and writes nothing.
TEST_F(NetSessionTest, AListenerWithoutTcpClosesAConnectionThatSendsItAFrame) {
  receiver.reset();
  ReceiverOptions o;
  o.instance = "d";
  o.frames = false;
  Result<std::unique_ptr<Receiver>> r = Receiver::start(net, *dst, key, o);
  ASSERT_TRUE(r) << r.error().message;
  receiver = std::move(r).value();
  auto c = session();
  c->send(frame(1));
  c->write_raw(c->seal_payload(
      std::vector<std::byte>(session_geometry().block_bytes(PoolTensor::kKey), std::byte{0x44})));
  EXPECT_TRUE(closed_by_listener(*c));
  EXPECT_EQ(receiver->frames().frames.load(), 0u);
  EXPECT_TRUE(untouched());
}

TEST_F(NetSessionTest, AnAlteredPayloadByteClosesTheConnectionWithoutAnAck) {
  auto c = session();
  const uint64_t block = session_geometry().block_bytes(PoolTensor::kKey);
  c->send(frame(1));  // the envelope, intact
  std::vector<std::byte> payload = c->seal_payload(std::vector<std::byte>(block, std::byte{0x33}));
  payload[block / 2] ^= std::byte{0x01};  // one bit changed on the way
  c->write_raw(payload);
  EXPECT_TRUE(closed_by_listener(*c)) << "closed, no ack";
  EXPECT_EQ(receiver->frames().frames.load(), 1u) << "the frame was admitted";
}

// A frame of several runs is one record: a byte changed in its last run
// closes the connection before the transfer is acked, although its first
// runs were already read into the pool.
TEST_F(NetSessionTest, AnAlteredByteInAFrameOfSeveralRunsClosesTheConnectionWithoutAnAck) {
  auto c = session();
  const uint64_t block = session_geometry().block_bytes(PoolTensor::kKey);
  tcp::FrameHeader f;
  f.transfer = 1;
  f.bytes = 3 * block;
  f.last = true;
  const std::vector<tcp::FrameRun> runs = {
      {3 * block, block}, {5 * block, block}, {9 * block, block}};
  std::vector<std::byte> out;
  tcp::encode_frame(f, runs, out);
  c->send(std::move(out));
  std::vector<std::byte> payload =
      c->seal_payload(std::vector<std::byte>(3 * block, std::byte{0x33}));
  payload[2 * block + 5] ^= std::byte{0x01};
  c->write_raw(payload);
  EXPECT_TRUE(closed_by_listener(*c)) << "closed, no ack";
  EXPECT_EQ(receiver->frames().frames.load(), 1u) << "the frame was admitted";
}

// A byte injected between two records of a keyed session: the next record's
// tag fails and the connection closes before it is acted on.
TEST_F(NetSessionTest, AnInjectedEnvelopeClosesTheConnectionAndWritesNothing) {
  auto c = session();
  std::vector<std::byte> injected = frame(7);
  injected.resize(injected.size() + net::kTagBytes, std::byte{0});  // a made-up tag
  c->write_raw(injected);
  EXPECT_TRUE(closed_by_listener(*c));
  EXPECT_TRUE(untouched());
  EXPECT_EQ(receiver->frames().frames.load(), 0u);
}

// A whole record replayed (sent again as it was on the wire): its counter is
// behind, so its tag fails, and the duplicate is never acted on.
TEST_F(NetSessionTest, AReplayedFrameClosesTheConnectionAndIsNotAckedTwice) {
  auto c = session();
  const uint64_t block = session_geometry().block_bytes(PoolTensor::kKey);
  std::vector<std::byte> wire = c->send(frame(1), std::vector<std::byte>(block, std::byte{0x44}));
  Result<net::Inbound> ack = c->read();
  ASSERT_TRUE(ack) << ack.error().message;
  Result<tcp::Message> m = tcp::decode(*ack);
  ASSERT_TRUE(m && m->kind == tcp::Message::Kind::kAck && m->ack.ok);
  c->write_raw(wire);  // the same bytes again
  EXPECT_TRUE(closed_by_listener(*c));
  EXPECT_EQ(receiver->frames().frames.load(), 1u) << "the replay was not admitted";
}

// Before the key is proved the listener says nothing of itself: a keyless
// peer's wrong proof is met by a closed connection, not by a refusal that
// carries the pool's geometry or the instance.
TEST_F(NetSessionTest, AWrongProofLearnsNothingAboutTheListener) {
  RawNetClient c(receiver->port());
  Result<net::Inbound> challenge = c.read();
  ASSERT_TRUE(challenge);
  EXPECT_EQ(challenge->kind, schema::NetEnvelope::CHALLENGE);
  std::vector<std::byte> out;
  const AuthKey wrong = AuthKey::from_bytes(std::vector<uint8_t>(32, 9));
  const Nonce mine = random_nonce();
  const uint8_t modes[1] = {1};
  net::encode_proof(mine, net::Protection::kAuthenticate,
                    wrong.mac(kConnectLabel, {challenge->nonce, mine, modes}), out);
  c.write_raw(out);
  EXPECT_TRUE(closed_by_listener(c)) << "no helloAck, no geometry";
}

}  // namespace
}  // namespace kvrelay::worker
