// The tcp transport over loopback, in one process: a receiver on a pool and
// a sender on another, each on the network thread, as two workers run them.
// What arrives byte for byte, what is refused (a wrong key, a silent client,
// a frame out of range, a pool of another shape), and how a peer that goes
// away fails the transfers it had and is reached again afterwards.
#include "worker/tcp/tcp_transport.h"

#include <capnp/message.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "raw_net_client.h"
#include "support/pool_patterns.h"
#include "worker/receiver.h"
#include "worker/tcp/frame_wire.h"

namespace kvrelay::worker::tcp {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

using kvrelay::testing::fill;
using kvrelay::testing::wrong_bytes;

PoolGeometry geometry(uint32_t head_dim = 64) { return kvrelay::testing::transport_geometry(head_dim); }

std::unique_ptr<HostSegmentPool> make_pool(const std::string& tag, const PoolGeometry& g) {
  return kvrelay::testing::make_test_pool("tcptest", tag, g);
}

// A path between a sender and a listener that carries the listener's words
// to the sender and drops the sender's: its proof of the key never arrives,
// and the sender's connection stays open (a stalled or overloaded peer, as
// the sender sees it), even after the listener gives up on its side.
class OneWayRelay {
 public:
  explicit OneWayRelay(uint16_t upstream) : upstream_(upstream) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(listener_, 16) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      ADD_FAILURE() << "relay: cannot listen";
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~OneWayRelay() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_) ::close(fd);
    ::close(listener_);
  }
  uint16_t port() const { return port_; }

 private:
  struct Pair {
    int client, upstream;
  };
  void run() {
    std::vector<Pair> pairs;
    char buf[4096];
    while (!stop_) {
      std::vector<pollfd> fds{{listener_, POLLIN, 0}};
      for (const Pair& p : pairs) {
        fds.push_back({p.client, POLLIN, 0});
        fds.push_back({p.upstream, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      const size_t polled = pairs.size();  // a pair accepted below was not polled
      if (fds[0].revents & POLLIN) {
        const int c = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        const int u = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(upstream_);
        if (c >= 0 && ::connect(u, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0)
          pairs.push_back({c, u});
        fds_.push_back(c);
        fds_.push_back(u);
      }
      for (size_t i = 0; i < polled; ++i) {
        if (fds[1 + 2 * i].revents & POLLIN)  // the sender's words: dropped
          (void)::read(pairs[i].client, buf, sizeof buf);
        if (fds[2 + 2 * i].revents & (POLLIN | POLLHUP)) {  // the listener's: passed on
          const ssize_t n = ::read(pairs[i].upstream, buf, sizeof buf);
          if (n > 0) (void)::write(pairs[i].client, buf, static_cast<size_t>(n));
          if (n <= 0) pairs[i].upstream = -1;  // gone: the sender's side stays open
        }
      }
      std::erase_if(pairs, [](const Pair& p) { return p.upstream < 0; });
    }
  }
  uint16_t upstream_, port_ = 0;
  int listener_ = -1;
  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

using kvrelay::testing::RawNetClient;

class TcpTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src = make_pool("src", geometry());
    dst = make_pool("dst", geometry());
    fill(*src);
  }
  void TearDown() override {
    sender.reset();
    receiver.reset();
    for (auto* p : {src.get(), dst.get()})
      if (p != nullptr) (void)p->segment().unlink();
  }

  net::Timing timing() {
    net::Timing t;
    t.heartbeat = 20ms;
    t.peer_timeout = 300ms;
    return t;
  }
  void listen(const LocalPool& pool, uint16_t port = 0) {
    ReceiverOptions o;
    o.port = port;
    o.instance = "d";
    o.timing = timing();
    o.handshake_timeout = 500ms;
    Result<std::unique_ptr<Receiver>> r = Receiver::start(net, pool, key, o);
    ASSERT_TRUE(r) << r.error().message;
    receiver = std::move(r).value();
  }
  void connect_with(const AuthKey& k) {
    SenderOptions o;
    o.instance = "p";
    o.lanes = 2;
    o.timing = timing();
    o.connect_timeout = 1000ms;
    sender = std::make_unique<TcpTransport>(net, *src, &k, o, nullptr);
  }
  std::shared_ptr<Destination> destination(uint16_t port) {
    return kvrelay::testing::loopback_tcp_destination(*sender, {port});
  }
  std::vector<TransferCompletion> send_all_layers(Destination& dest, uint64_t handle,
                                                  const std::vector<uint32_t>& src_ids,
                                                  const std::vector<uint32_t>& dst_ids,
                                                  uint64_t request = 0) {
    return kvrelay::testing::send_all_layers(*sender, dest, src->geometry().total_layers(),
                                             handle, src_ids, dst_ids, request);
  }
  std::vector<TransferCompletion> wait_for(size_t n) {
    return kvrelay::testing::wait_for_completions(*sender, n);
  }
  // A hand-driven peer with the key, its helloAck checked.
  std::unique_ptr<RawNetClient> keyed_raw_peer() {
    auto c = std::make_unique<RawNetClient>(receiver->port());
    Result<net::Inbound> ack = c->authenticate(key, RawNetClient::raw_hello(geometry()));
    EXPECT_TRUE(ack && ack->hello_ack.accepted)
        << (ack ? ack->hello_ack.reason : ack.error().message);
    return c;
  }
  // The next tcp message the listener sends `c`.
  static Result<Message> next_tcp_message(RawNetClient& c) {
    Result<net::Inbound> in = c.read();
    if (!in) return in.error();
    return decode(*in);
  }

  AuthKey key = AuthKey::from_bytes(std::vector<uint8_t>(32, 7));
  std::unique_ptr<HostSegmentPool> src, dst;
  net::NetThread net;
  std::unique_ptr<Receiver> receiver;
  std::unique_ptr<TcpTransport> sender;
};

TEST_F(TcpTransportTest, ScatteredBlocksArriveByteForByteAndNothingElseIsTouched) {
  listen(*dst);
  connect_with(key);
  auto dest = destination(receiver->port());
  ASSERT_TRUE(dest);
  const std::vector<uint32_t> src_ids = {3, 4, 5, 9, 1, 20};
  const std::vector<uint32_t> dst_ids = {10, 11, 12, 2, 30, 31};
  const auto done = send_all_layers(*dest, 1, src_ids, dst_ids);
  ASSERT_EQ(done.size(), 3u);
  for (const TransferCompletion& c : done) {
    EXPECT_TRUE(c.status) << c.status.error().message;
    EXPECT_EQ(c.bytes, src_ids.size() * 2 * geometry().block_bytes(PoolTensor::kKey));
  }
  EXPECT_EQ(wrong_bytes(*dst, src_ids, dst_ids), 0u);
  EXPECT_EQ(receiver->connections().accepted.load(), 2u) << "two lanes";
  EXPECT_EQ(receiver->connections().refused.load(), 0u);
  // Four runs a tensor (3-5, 9, 1, 20), each tensor's as one frame of runs.
  EXPECT_EQ(receiver->frames().frames.load(), 3u * 2) << "a frame per layer and tensor";
}

// Heterogeneous TP (tp 1 with 2 heads -> tp 2 with 1 each): a share that is
// not every head of a block travels as a frame per block, far more frames
// than the layer's coalesced runs. The receiver acks a transfer at its last
// frame, so every byte must be there when the sender's completion is. (The
// last frame was once counted by runs: it was marked after the second of 48
// frames, and completions came before their heads had landed.)
TEST_F(TcpTransportTest, AHeadShareIsCompleteAtItsCompletionWhateverItsFrameCount) {
  PoolGeometry half = geometry();
  half.kv_heads = 1;
  std::vector<std::unique_ptr<HostSegmentPool>> decode;
  std::vector<std::unique_ptr<Receiver>> receivers;
  for (uint32_t r = 0; r < 2; ++r) {
    decode.push_back(make_pool(fmt::format("half{}", r), half));
    ReceiverOptions o;
    o.instance = "d";
    o.rank = r;
    o.heads = HeadLayout{2, 1, 2};
    o.timing = timing();
    o.handshake_timeout = 500ms;
    Result<std::unique_ptr<Receiver>> started = Receiver::start(net, *decode[r], key, o);
    ASSERT_TRUE(started) << started.error().message;
    receivers.push_back(std::move(started).value());
  }
  connect_with(key);
  std::shared_ptr<Destination> dest = kvrelay::testing::loopback_tcp_destination(
      *sender, {receivers[0]->port(), receivers[1]->port()});
  ASSERT_TRUE(dest);
  ASSERT_EQ(dest->transfers_per_submit(), 2u);
  // One coalesced run of 24 blocks: 24 frames per tensor and decode rank.
  std::vector<uint32_t> src_ids, dst_ids;
  for (uint32_t b = 0; b < 24; ++b) {
    src_ids.push_back(4 + b);
    dst_ids.push_back(6 + b);
  }
  for (int round = 0; round < 5; ++round) {
    for (auto& p : decode)  // nothing of the last round left to be mistaken for this one's
      for (uint32_t l = 0; l < half.total_layers(); ++l)
        for (uint32_t t = 0; t < half.tensors_per_layer(); ++t) {
          const auto tensor = static_cast<PoolTensor>(t);
          std::memset(p->tensor(l, tensor), 0, half.blocks_in_layer(l) * half.block_bytes(tensor));
        }
    const auto done = send_all_layers(*dest, 1 + round, src_ids, dst_ids);
    ASSERT_EQ(done.size(), 2u * 3u) << "a completion per layer and decode rank";
    for (const TransferCompletion& c : done)
      ASSERT_TRUE(c.status) << c.status.error().message;
    // Checked the moment the completions are in, not after a pause.
    for (uint32_t r = 0; r < 2; ++r)
      ASSERT_EQ(kvrelay::testing::wrong_head_bytes(*src, r, *decode[r], 0, 1, src_ids, dst_ids), 0u)
          << "round " << round << ": decode rank " << r << " lacks heads its completion vouched for";
  }
  sender.reset();
  receivers.clear();
  for (auto& p : decode)
    (void)p->segment().unlink();
}

TEST_F(TcpTransportTest, AWrongKeyIsRefusedAndNoPoolByteIsTouched) {
  listen(*dst);
  const AuthKey wrong = AuthKey::from_bytes(std::vector<uint8_t>(32, 8));
  connect_with(wrong);
  auto dest = destination(receiver->port());
  ASSERT_TRUE(dest);
  const auto done = send_all_layers(*dest, 1, {1, 2}, {3, 4});
  ASSERT_EQ(done.size(), 3u);
  for (const TransferCompletion& c : done) {
    ASSERT_FALSE(c.status);
    EXPECT_NE(c.status.error().message.find("authentication failed"), std::string::npos)
        << c.status.error().message;
  }
  EXPECT_GE(receiver->connections().refused.load(), 1u);
  EXPECT_EQ(receiver->frames().frames.load(), 0u);
  EXPECT_EQ(wrong_bytes(*dst, {}, {}), 0u);
}

// The sender's own connect deadline passing while its proof waits for an
// answer is not the listener refusing the key: the failure says which.
TEST_F(TcpTransportTest, AProofNeverAnsweredIsReportedAsSilenceNotAsAWrongKey) {
  listen(*dst);
  OneWayRelay relay(receiver->port());
  connect_with(key);
  auto dest = destination(relay.port());
  ASSERT_TRUE(dest);
  const auto done = send_all_layers(*dest, 1, {1, 2}, {3, 4});
  ASSERT_EQ(done.size(), 3u);
  for (const TransferCompletion& c : done) {
    ASSERT_FALSE(c.status);
    const std::string& m = c.status.error().message;
    EXPECT_NE(m.find("had not answered this side's proof"), std::string::npos) << m;
    EXPECT_EQ(m.find("a different key there"), std::string::npos) << m;
  }
  EXPECT_EQ(wrong_bytes(*dst, {}, {}), 0u);
}

TEST_F(TcpTransportTest, APoolOfAnotherShapeIsRefusedNamingTheField) {
  auto other = make_pool("other", geometry(128));
  listen(*other);
  connect_with(key);
  auto dest = destination(receiver->port());
  const auto done = send_all_layers(*dest, 1, {1}, {1});
  ASSERT_EQ(done.size(), 3u);
  ASSERT_FALSE(done[0].status);
  EXPECT_NE(
      done[0].status.error().message.find("pools differ in head_dim: 128 here, 64 at the peer"),
      std::string::npos)
      << done[0].status.error().message;
  receiver.reset();
  (void)other->segment().unlink();
}

TEST_F(TcpTransportTest, APeerThatGoesAwayIsReachedAgainForTheNextRequests) {
  listen(*dst);
  const uint16_t port = receiver->port();
  connect_with(key);
  auto dest = destination(port);
  ASSERT_TRUE(send_all_layers(*dest, 1, {1}, {1}).at(0).status);
  receiver.reset();  // the decode worker is gone
  auto failed = send_all_layers(*dest, 2, {2}, {2});
  ASSERT_EQ(failed.size(), 3u);
  for (const TransferCompletion& c : failed) ASSERT_FALSE(c.status);
  // Lost on a lane that had not yet seen the close, or refused on a new one.
  const std::string& why = failed[0].status.error().message;
  EXPECT_TRUE(why.find("cannot reach it") != std::string::npos ||
              why.find("connection lost") != std::string::npos)
      << why;
  listen(*dst, port);  // it is back
  bool sent = false;
  for (int attempt = 0; attempt < 100 && !sent; ++attempt) {
    auto done = send_all_layers(*dest, 3 + attempt, {5}, {6});
    sent = done.size() == 3 && done[0].status && done[1].status && done[2].status;
    if (!sent) std::this_thread::sleep_for(50ms);  // the backoff
  }
  EXPECT_TRUE(sent);
}

TEST_F(TcpTransportTest, AClientThatSaysNothingIsClosedAndTouchesNothing) {
  listen(*dst);
  RawNetClient silent(receiver->port());
  ASSERT_TRUE(silent.read()) << "the challenge";
  const auto t0 = std::chrono::steady_clock::now();
  // Heartbeats, perhaps a refusal, then the end of the stream.
  Result<net::Inbound> next = silent.read();
  while (next)
    next = silent.read();
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(waited, 3s);
  // Counted on the network thread just after the socket closed.
  for (int i = 0; i < 100 && receiver->connections().refused.load() == 0; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(receiver->connections().refused.load(), 1u);
  EXPECT_EQ(receiver->connections().accepted.load(), 0u);
  EXPECT_EQ(wrong_bytes(*dst, {}, {}), 0u);
}

// Before the key is proved only a proof is accepted: a keyless peer that
// sends anything else (heartbeats here) is refused, and learns nothing.
TEST_F(TcpTransportTest, AnythingButAProofBeforeTheKeyIsRefused) {
  listen(*dst);
  RawNetClient chatty(receiver->port());
  ASSERT_TRUE(chatty.read()) << "the challenge";
  std::vector<std::byte> beat;
  net::encode_heartbeat(beat);
  chatty.write_raw(beat);
  Result<net::Inbound> next = chatty.read();
  EXPECT_FALSE(next) << "closed without an answer";
  for (int i = 0; i < 100 && receiver->connections().refused.load() == 0; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(receiver->connections().refused.load(), 1u);
}

TEST_F(TcpTransportTest, AFrameOutOfRangeFailsOnlyItsTransferAndTheConnectionLivesOn) {
  listen(*dst);
  std::unique_ptr<RawNetClient> peer = keyed_raw_peer();
  ASSERT_FALSE(HasFailure());
  RawNetClient& client = *peer;
  const uint64_t block = geometry().block_bytes(PoolTensor::kKey);
  std::vector<std::byte> out;
  FrameHeader bad;
  bad.transfer = 1;
  bad.layer = 0;
  bad.dst_offset = 31 * block;
  bad.bytes = 2 * block;  // blocks 31..32 of 32
  bad.last = true;
  encode_frame(bad, out);
  client.send(std::move(out), std::vector<std::byte>(bad.bytes, std::byte{0x77}));
  FrameHeader good;
  good.transfer = 2;
  good.layer = 1;
  good.tensor = 1;
  good.dst_offset = 4 * block;
  good.bytes = block;
  good.last = true;
  out.clear();
  encode_frame(good, out);
  client.send(std::move(out), std::vector<std::byte>(good.bytes, std::byte{0x66}));
  Result<Message> first_ack = next_tcp_message(client);
  ASSERT_TRUE(first_ack && first_ack->kind == Message::Kind::kAck)
      << (first_ack ? "not an ack" : first_ack.error().message);
  EXPECT_EQ(first_ack->ack.transfer, 1u);
  EXPECT_FALSE(first_ack->ack.ok);
  EXPECT_EQ(first_ack->ack.reason,
            "frame writes destination blocks 31..32 of layer 0, but the pool has 32 blocks there");
  Result<Message> second_ack = next_tcp_message(client);
  ASSERT_TRUE(second_ack) << second_ack.error().message;
  EXPECT_EQ(second_ack->ack.transfer, 2u);
  EXPECT_TRUE(second_ack->ack.ok);
  const std::byte* v = dst->tensor(1, PoolTensor::kValue) + 4 * block;
  EXPECT_EQ(v[0], std::byte{0x66});
  EXPECT_EQ(dst->tensor(0, PoolTensor::kKey)[31 * block], std::byte{0}) << "nothing written";
  EXPECT_EQ(receiver->frames().refused_frames.load(), 1u);
}

// A frame of several runs is checked run by run before any byte lands: one
// run outside the pool refuses the whole frame, naming the run, and writes
// none of it; the next frame of several runs lands each run at its own
// place, under one tag.
TEST_F(TcpTransportTest, AFrameOfSeveralRunsLandsEachRunOrNoneOfThem) {
  listen(*dst);
  std::unique_ptr<RawNetClient> peer = keyed_raw_peer();
  ASSERT_FALSE(HasFailure());
  RawNetClient& client = *peer;
  const uint64_t block = geometry().block_bytes(PoolTensor::kKey);
  auto payload = [&](const std::vector<FrameRun>& runs) {
    std::vector<std::byte> bytes;
    for (size_t i = 0; i < runs.size(); ++i)
      bytes.resize(bytes.size() + runs[i].bytes, std::byte{static_cast<uint8_t>(0x50 + i)});
    return bytes;
  };
  FrameHeader bad;
  bad.transfer = 1;
  bad.layer = 0;
  bad.bytes = 3 * block;
  bad.last = true;
  const std::vector<FrameRun> bad_runs = {{7 * block, block}, {31 * block, 2 * block}};
  std::vector<std::byte> out;
  encode_frame(bad, bad_runs, out);
  client.send(std::move(out), payload(bad_runs));
  FrameHeader good = bad;
  good.transfer = 2;
  good.layer = 1;
  good.tensor = 1;
  good.bytes = 4 * block;
  const std::vector<FrameRun> good_runs = {
      {20 * block, block}, {2 * block, 2 * block}, {9 * block, block}};
  out.clear();
  encode_frame(good, good_runs, out);
  client.send(std::move(out), payload(good_runs));
  Result<Message> first_ack = next_tcp_message(client);
  ASSERT_TRUE(first_ack && first_ack->kind == Message::Kind::kAck)
      << (first_ack ? "not an ack" : first_ack.error().message);
  EXPECT_EQ(first_ack->ack.transfer, 1u);
  EXPECT_FALSE(first_ack->ack.ok);
  EXPECT_EQ(first_ack->ack.reason,
            "run 1 of 2: frame writes destination blocks 31..32 of layer 0, but the pool has 32 "
            "blocks there");
  Result<Message> second_ack = next_tcp_message(client);
  ASSERT_TRUE(second_ack) << second_ack.error().message;
  EXPECT_EQ(second_ack->ack.transfer, 2u);
  EXPECT_TRUE(second_ack->ack.ok) << second_ack->ack.reason;
  const std::byte* k0 = dst->tensor(0, PoolTensor::kKey);
  EXPECT_EQ(k0[7 * block], std::byte{0}) << "the refused frame's valid run was not written";
  EXPECT_EQ(k0[31 * block], std::byte{0});
  const std::byte* v1 = dst->tensor(1, PoolTensor::kValue);
  for (size_t i = 0; i < good_runs.size(); ++i) {
    const std::byte* at = v1 + good_runs[i].dst_offset;
    EXPECT_TRUE(
        std::all_of(at, at + good_runs[i].bytes,
                    [&](std::byte b) { return b == std::byte{static_cast<uint8_t>(0x50 + i)}; }))
        << "run " << i << " landed whole at its own offset";
  }
  EXPECT_EQ(v1[3 * block + block], std::byte{0}) << "nothing between the runs";
  EXPECT_EQ(receiver->frames().refused_frames.load(), 1u);
  EXPECT_EQ(receiver->frames().frames.load(), 1u);
}

TEST_F(TcpTransportTest, WithoutAKeyTcpIsRefusedSayingWhichFlagIsMissing) {
  SenderOptions o;
  sender = std::make_unique<TcpTransport>(net, *src, nullptr, o, nullptr);
  capnp::MallocMessageBuilder m;
  auto d = m.initRoot<schema::CacheDest>();
  d.setProtocol(schema::TransferProtocol::TCP);
  d.setPeerAddress("127.0.0.1");
  d.initTcpPorts(1).set(0, 9);
  Result<std::shared_ptr<Destination>> dest = sender->resolve(d.asReader());
  ASSERT_FALSE(dest);
  EXPECT_NE(dest.error().message.find("--auth-key-file"), std::string::npos);
}

}  // namespace
}  // namespace kvrelay::worker::tcp
