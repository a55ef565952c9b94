// The rdma transport in one process, over the fake fabric (fake_fabric.h):
// a receiver (the tcp listener with rdma sessions) on one pool and a sender
// on another, each on the network thread, as two workers run them. What
// arrives byte for byte; what the receiver refuses before a byte is written
// (blocks out of range, blocks an expected request holds); how a failed work
// completion ends the session, fails what it carried and leaves the next
// request to a fresh one; a receiver that goes away; and the refusals that
// name what is missing.
#include "worker/rdma/rdma_transport.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <thread>

#include "fake_fabric.h"
#include "support/pool_patterns.h"
#include "worker/receiver.h"

namespace kvrelay::worker::rdma {
namespace {

using namespace std::chrono_literals;
using kvrelay::testing::fill;
using kvrelay::testing::wrong_bytes;
using testing::FakeFabric;

class RdmaTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src = kvrelay::testing::make_test_pool("rdmatest", "src", kvrelay::testing::transport_geometry());
    dst = kvrelay::testing::make_test_pool("rdmatest", "dst", kvrelay::testing::transport_geometry());
    fill(*src);
    arrivals = std::make_shared<Arrivals>(dst->geometry(), nullptr);
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
    t.peer_timeout = peer_timeout;
    return t;
  }
  // Short, so that the tests of lost peers end soon; a test of thousands of
  // writes sets more (the fake fabric's writes are slow under TSan).
  std::chrono::milliseconds peer_timeout = 300ms;
  void listen(bool with_rdma = true, uint16_t port = 0) {
    ReceiverOptions o;
    o.port = port;
    o.instance = "d";
    o.timing = timing();
    o.handshake_timeout = 500ms;
    o.arrivals = arrivals;
    if (with_rdma) o.rdma = rdma_listener = std::make_shared<RdmaListener>(&fabric, "", *dst, 0);
    Result<std::unique_ptr<Receiver>> r = Receiver::start(net, *dst, key, o);
    ASSERT_TRUE(r) << r.error().message;
    receiver = std::move(r).value();
  }
  void connect(Fabric* f = nullptr, const std::string& why_not = "") {
    RdmaSenderOptions o;
    o.instance = "p";
    o.queue_pairs = 2;
    o.signal_every = 4;
    o.timing = timing();
    o.connect_timeout = 1000ms;
    sender = std::make_unique<RdmaTransport>(net, *src, &key, f == nullptr && why_not.empty()
                                                                 ? &fabric
                                                                 : f,
                                             why_not, o, nullptr);
  }
  Result<std::shared_ptr<Destination>> resolve(uint16_t port) {
    capnp::MallocMessageBuilder m;
    auto d = m.initRoot<schema::CacheDest>();
    d.setProtocol(schema::TransferProtocol::RDMA);
    d.setPeerAddress("127.0.0.1");
    d.setPeerInstance("d");
    d.initRdmaPorts(1).set(0, port);
    return sender->resolve(d.asReader());
  }
  std::shared_ptr<Destination> destination(uint16_t port) {
    Result<std::shared_ptr<Destination>> dest = resolve(port);
    EXPECT_TRUE(dest) << dest.error().message;
    return dest ? *dest : nullptr;
  }
  std::vector<TransferCompletion> send_all_layers(Destination& dest, uint64_t handle,
                                                  const std::vector<uint32_t>& src_ids,
                                                  const std::vector<uint32_t>& dst_ids,
                                                  uint64_t request = 0) {
    return kvrelay::testing::send_all_layers(*sender, dest, src->geometry().total_layers(),
                                             handle, src_ids, dst_ids, request,
                                             src->geometry().num_blocks);
  }
  std::vector<TransferCompletion> wait_for(size_t n) {
    return kvrelay::testing::wait_for_completions(*sender, n);
  }
  static std::string message(const TransferCompletion& c) {
    return c.status ? "" : c.status.error().message;
  }
  // A session's answer to an intent part: what on_intent gives, or, where
  // the grant waits for its windows' binds, the grants poll() gives then.
  static Result<std::optional<std::vector<Grant>>> answer(RdmaSession& s, const Intent& part) {
    Result<std::optional<std::vector<Grant>>> r = s.on_intent(part);
    if (!r || *r || !part.last) return r;
    std::vector<Ack> acks;
    std::vector<Grant> grants;
    if (Status st = s.poll(acks, grants); !st) return st.error();
    if (grants.empty()) return r;
    return std::optional<std::vector<Grant>>(std::move(grants));
  }

  // Scattered blocks move byte for byte, one immediate per layer transfer,
  // through windows bound per run and tensor (`windows`), or under the pool
  // registration's keys on a device without windows.
  void scattered_blocks_arrive(bool windows);

  AuthKey key = AuthKey::from_bytes(std::vector<uint8_t>(32, 7));
  FakeFabric fabric;  // outlives every queue pair
  std::shared_ptr<RdmaListener> rdma_listener;  // listen()'s
  std::unique_ptr<HostSegmentPool> src, dst;
  std::shared_ptr<Arrivals> arrivals;
  net::NetThread net;
  std::unique_ptr<Receiver> receiver;
  std::unique_ptr<RdmaTransport> sender;
};

TEST_F(RdmaTransportTest, ScatteredBlocksArriveByteForByteWithOneImmediatePerTransfer) {
  scattered_blocks_arrive(true);
}

TEST_F(RdmaTransportTest, ScatteredBlocksArriveUnderThePoolsKeysOnADeviceWithoutWindows) {
  scattered_blocks_arrive(false);
}

void RdmaTransportTest::scattered_blocks_arrive(bool windows) {
  fabric.supports_windows = windows;
  listen();
  connect();
  auto dest = destination(receiver->port());
  ASSERT_TRUE(dest);
  // Two runs of three and two blocks, and a single block: 3 runs x 2 tensors.
  const std::vector<uint32_t> src_ids = {3, 4, 5, 9, 10, 20};
  const std::vector<uint32_t> dst_ids = {10, 11, 12, 2, 3, 31};
  const auto done = send_all_layers(*dest, 1, src_ids, dst_ids);
  ASSERT_EQ(done.size(), 3u);
  for (const TransferCompletion& c : done) {
    EXPECT_TRUE(c.status) << message(c);
    EXPECT_EQ(c.bytes, src_ids.size() * 2 * src->geometry().block_bytes(PoolTensor::kKey));
  }
  EXPECT_EQ(wrong_bytes(*dst, src_ids, dst_ids), 0u);
  EXPECT_EQ(fabric.writes.load(), 3u * 3 * 2) << "one write per run and tensor";
  EXPECT_EQ(fabric.with_immediate.load(), 3u) << "one immediate per layer transfer";
  const uint64_t window_ops = windows ? 3u * 3 * 2 : 0;
  EXPECT_EQ(fabric.binds.load(), window_ops) << "a window per run and tensor";
  EXPECT_EQ(fabric.invalidations.load(), window_ops) << "each invalidated at its landing";
  EXPECT_EQ(receiver->sessions().sessions.load(), 1u);
  EXPECT_EQ(receiver->sessions().transfers.load(), 3u);
  EXPECT_EQ(receiver->frames().frames.load(), 0u) << "no byte went over tcp";
  // Each side registered its pool once (one shared-memory segment: one region).
  EXPECT_EQ(fabric.registrations.load(), 2u);

  // A second request reuses the session and its queue pairs.
  const auto again = send_all_layers(*dest, 2, {1}, {5});
  ASSERT_EQ(again.size(), 3u);
  EXPECT_TRUE(again[0].status) << message(again[0]);
  EXPECT_EQ(fabric.queue_pairs_created.load(), 4u) << "2 per side, once";
  EXPECT_EQ(fabric.registrations.load(), 2u);
}

TEST_F(RdmaTransportTest, ManyTransfersInFlightFillTheSendQueuesAndAllLand) {
  listen();
  connect();
  auto dest = destination(receiver->port());
  ASSERT_TRUE(dest);
  // 16 non-adjacent blocks: 32 writes per layer, more than one chain, and 20
  // requests at once: more writes than the fake's 64 send-queue slots.
  std::vector<uint32_t> ids;
  for (uint32_t b = 0; b < 32; b += 2)
    ids.push_back(b);
  Result<std::vector<BlockRun>> runs = plan_block_runs(ids, ids, 32, 32, 0, 0);
  ASSERT_TRUE(runs);
  for (uint64_t h = 1; h <= 20; ++h)
    for (uint32_t l = 0; l < 3; ++l) {
      TransferTicket t;
      t.handle = h;
      t.layer = l;
      ASSERT_TRUE(dest->submit_layer(t, l, *runs));
    }
  const auto done = wait_for(60);
  ASSERT_EQ(done.size(), 60u);
  for (const TransferCompletion& c : done)
    ASSERT_TRUE(c.status) << message(c);
  EXPECT_EQ(wrong_bytes(*dst, ids, ids), 0u);
  EXPECT_EQ(fabric.with_immediate.load(), 60u);
}

TEST_F(RdmaTransportTest, BlocksAnExpectedRequestHoldsAreRefusedBeforeAnyWrite) {
  listen();
  connect();
  auto dest = destination(receiver->port());
  ASSERT_TRUE(dest);
  ASSERT_TRUE(arrivals->expect(7, "req-7", {20, 21}));
  // Another request's transfer into block 21, which req-7 holds.
  const auto refused = send_all_layers(*dest, 1, {1}, {21}, request_key("other"));
  ASSERT_EQ(refused.size(), 3u);
  for (const TransferCompletion& c : refused) {
    ASSERT_FALSE(c.status);
    EXPECT_NE(message(c).find("the receiver refused it"), std::string::npos) << message(c);
  }
  EXPECT_EQ(fabric.writes.load(), 0u) << "nothing was written";
  EXPECT_EQ(wrong_bytes(*dst, {}, {}), 0u);
  EXPECT_EQ(receiver->sessions().refused.load(), 3u);

  // The declared request itself lands and arrives, on the same session.
  const auto ok = send_all_layers(*dest, 2, {4, 5}, {20, 21}, request_key("req-7"));
  ASSERT_EQ(ok.size(), 3u);
  for (const TransferCompletion& c : ok)
    ASSERT_TRUE(c.status) << message(c);
  EXPECT_EQ(wrong_bytes(*dst, {4, 5}, {20, 21}), 0u);
  const std::vector<ArrivalEvent> events = arrivals->take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].handle, 7u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kArrived) << events[0].message;
  EXPECT_EQ(receiver->sessions().sessions.load(), 1u) << "a refusal does not end the session";
}

TEST_F(RdmaTransportTest, BlocksOutsideTheDecodePoolAreRefusedNamingThem) {
  listen();
  connect();
  auto dest = destination(receiver->port());
  ASSERT_TRUE(dest);
  // The sender plans against its own pool size; the receiver checks its own.
  TransferTicket t;
  t.handle = 1;
  const BlockRun run{0, 30, 4};  // 30..33 of 32
  ASSERT_TRUE(dest->submit_layer(t, 0, std::span<const BlockRun>(&run, 1)));
  const auto done = wait_for(1);
  ASSERT_EQ(done.size(), 1u);
  ASSERT_FALSE(done[0].status);
  EXPECT_NE(message(done[0]).find("destination blocks 30..33 of layer 0, but the pool has 32"),
            std::string::npos)
      << message(done[0]);
  EXPECT_EQ(fabric.writes.load(), 0u);
}

TEST_F(RdmaTransportTest, AFailedCompletionFailsTheSessionsTransfersAndTheNextRequestsSucceed) {
  listen();
  connect();
  auto dest = destination(receiver->port());
  ASSERT_TRUE(dest);
  ASSERT_TRUE(send_all_layers(*dest, 1, {1}, {1}).at(0).status);
  fabric.fail_write_number = fabric.writes.load() + 1;  // the next write fails
  const auto failed = send_all_layers(*dest, 2, {2, 3}, {2, 3});
  ASSERT_EQ(failed.size(), 3u);
  size_t errors = 0;
  for (const TransferCompletion& c : failed) {
    if (c.status) continue;
    ++errors;
    EXPECT_NE(message(c).find("transport retry counter exceeded"), std::string::npos)
        << message(c);
  }
  EXPECT_GE(errors, 1u) << "the transfer whose write failed";
  // The session is gone on both sides; the next request opens a fresh one.
  const auto later = send_all_layers(*dest, 3, {6, 7}, {6, 7});
  ASSERT_EQ(later.size(), 3u);
  for (const TransferCompletion& c : later)
    EXPECT_TRUE(c.status) << message(c);
  EXPECT_EQ(receiver->sessions().sessions.load(), 2u);
  // What the worker's counters show of it (kvrelay-dump's network section).
  EXPECT_EQ(sender->link_stats().opened.load(), 2u);
  EXPECT_EQ(sender->link_stats().lost.load(), 1u);
  EXPECT_EQ(sender->link_stats().unreachable.load(), 0u);
  for (uint32_t l = 0; l < 3; ++l)
    for (uint32_t b : {6u, 7u})
      EXPECT_EQ(dst->tensor(l, PoolTensor::kValue)[b * src->geometry().block_bytes(PoolTensor::kValue)],
                kvrelay::testing::pattern(l, 1, b, 0));
  // Nothing of the dead session is kept: two queue pairs a side remain.
  EXPECT_EQ(fabric.live_queue_pairs(), 4u);
}

TEST_F(RdmaTransportTest, AReceiverThatGoesAwayFailsWhatItCarriedAndIsReachedAgain) {
  listen();
  const uint16_t port = receiver->port();
  connect();
  auto dest = destination(port);
  ASSERT_TRUE(send_all_layers(*dest, 1, {1}, {1}).at(0).status);
  receiver.reset();  // the decode worker is gone, its queue pairs with it
  const auto failed = send_all_layers(*dest, 2, {2}, {2});
  ASSERT_EQ(failed.size(), 3u);
  for (const TransferCompletion& c : failed)
    ASSERT_FALSE(c.status);
  listen(true, port);
  std::vector<TransferCompletion> later;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < until) {  // past the reconnect backoff
    later = send_all_layers(*dest, 3, {4}, {4});
    if (later.size() == 3 && later[0].status) break;
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_EQ(later.size(), 3u);
  EXPECT_TRUE(later[0].status) << message(later[0]);
  EXPECT_EQ(fabric.live_queue_pairs(), 4u) << "the dead session's queue pairs are gone";
  EXPECT_EQ(sender->link_stats().lost.load(), 1u);
  EXPECT_EQ(sender->link_stats().opened.load(), 2u);
}

TEST_F(RdmaTransportTest, ASessionRefusesIntentsNoSenderOfOursWouldSend) {
  // What a hostile or broken peer could send on an authenticated connection,
  // straight to the receiving session.
  RdmaListener listener(&fabric, "", *dst, 0);
  Result<std::unique_ptr<RcQueuePair>> theirs = fabric.create_queue_pair();
  ASSERT_TRUE(theirs);
  const QpEndpoint offer[] = {(*theirs)->local()};
  Result<std::unique_ptr<RdmaSession>> session =
      RdmaSession::accept(listener, *arrivals, offer, "test peer", "p0");
  ASSERT_TRUE(session) << session.error().message;

  // More runs than the layer has blocks, over several parts: refused before
  // it can grow without bound.
  Intent part;
  part.transfer = 1;
  part.layer = 0;
  part.last = false;
  part.runs.assign(20, BlockSpan{0, 1});
  ASSERT_TRUE((*session)->on_intent(part));
  Result<std::optional<std::vector<Grant>>> more = (*session)->on_intent(part);
  ASSERT_FALSE(more);
  EXPECT_NE(more.error().message.find("40 runs for a layer of 32 blocks"), std::string::npos)
      << more.error().message;

  // A second transfer under the immediate of one still open is a protocol error.
  Result<std::unique_ptr<RdmaSession>> fresh =
      RdmaSession::accept(listener, *arrivals, offer, "test peer", "p0");
  ASSERT_TRUE(fresh);
  part.runs = {BlockSpan{1, 1}};
  part.last = true;
  ASSERT_TRUE((*fresh)->on_intent(part));  // granted: transfer 1 holds immediate 1
  part.transfer = 1 + (uint64_t{1} << 32);  // same low 32 bits
  Result<std::optional<std::vector<Grant>>> clash = (*fresh)->on_intent(part);
  ASSERT_FALSE(clash);
  EXPECT_NE(clash.error().message.find("holds its immediate"), std::string::npos);

  // Sessions that go take their queue pairs with them (theirs is the test's).
  EXPECT_EQ(fabric.live_queue_pairs(), 3u);
  fresh = make_error(Errc::kAborted, "closed");
  session = make_error(Errc::kAborted, "closed");
  EXPECT_EQ(fabric.live_queue_pairs(), 1u);
}

// A grant answers each part of an intent with a key per run and tensor,
// for the queue pair the intent named; an intent for a queue pair the
// session lacks, parts that disagree on theirs, and a part that adds no
// runs are protocol errors. Here on a device without memory windows: the
// keys are the pool registration's (rdma_windows_test.cpp has the windows).
TEST_F(RdmaTransportTest, ASessionGrantsAKeyPerRunAndTensorInAPartPerIntentPart) {
  fabric.supports_windows = false;
  RdmaListener listener(&fabric, "", *dst, 0);
  std::vector<std::unique_ptr<RcQueuePair>> theirs;
  std::vector<QpEndpoint> offer;
  for (int i = 0; i < 2; ++i) {
    Result<std::unique_ptr<RcQueuePair>> qp = fabric.create_queue_pair();
    ASSERT_TRUE(qp);
    offer.push_back((*qp)->local());
    theirs.push_back(std::move(qp).value());
  }
  auto open = [&] {
    Result<std::unique_ptr<RdmaSession>> s =
        RdmaSession::accept(listener, *arrivals, offer, "test peer", "p0");
    EXPECT_TRUE(s) << s.error().message;
    return s ? std::move(s).value() : nullptr;
  };
  std::unique_ptr<RdmaSession> session = open();
  ASSERT_TRUE(session);
  const uint32_t tensors = dst->geometry().tensors_per_layer();
  Intent part;
  part.transfer = 1;
  part.layer = 2;
  part.queue_pair = 1;
  part.last = false;
  part.runs = {BlockSpan{0, 1}, BlockSpan{2, 3}};
  Result<std::optional<std::vector<Grant>>> pending = session->on_intent(part);
  ASSERT_TRUE(pending && !*pending) << "no answer before the last part";
  part.last = true;
  part.runs = {BlockSpan{9, 2}};
  Result<std::optional<std::vector<Grant>>> grant = session->on_intent(part);
  ASSERT_TRUE(grant && *grant);
  const std::vector<Grant>& parts = **grant;
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_TRUE(parts[0].ok && parts[1].ok);
  EXPECT_FALSE(parts[0].last);
  EXPECT_TRUE(parts[1].last);
  ASSERT_EQ(parts[0].rkeys.size(), 2u * tensors);
  ASSERT_EQ(parts[1].rkeys.size(), 1u * tensors);
  const std::vector<RemoteTensor>& registered = session->registration().tensors();
  for (const Grant& g : parts) {
    EXPECT_EQ(g.transfer, 1u);
    for (size_t k = 0; k < g.rkeys.size(); ++k)
      EXPECT_EQ(g.rkeys[k], registered[2 * tensors + k % tensors].rkey) << k;
  }

  // What the session says of a part that breaks the protocol ("" if it did not).
  auto protocol_error = [&](const Intent& p) {
    Result<std::optional<std::vector<Grant>>> r = session->on_intent(p);
    return r ? std::string() : r.error().message;
  };
  part.transfer = 2;
  part.runs = {BlockSpan{20, 1}};
  part.queue_pair = 2;
  const std::string nowhere = protocol_error(part);
  EXPECT_NE(nowhere.find("queue pair 2 of a session of 2"), std::string::npos) << nowhere;

  session = open();
  part.transfer = 3;
  part.queue_pair = 0;
  part.last = false;
  ASSERT_TRUE(session->on_intent(part));
  part.queue_pair = 1;
  part.last = true;
  const std::string moved = protocol_error(part);
  EXPECT_NE(moved.find("queue pairs 0 and 1"), std::string::npos) << moved;

  session = open();
  part.transfer = 4;
  part.runs.clear();
  part.last = false;
  const std::string empty = protocol_error(part);
  EXPECT_NE(empty.find("with no runs"), std::string::npos) << empty;
}

// A layer of more scattered runs than an intent part holds goes as an
// intent in parts, is granted in as many parts, and lands byte for byte.
TEST_F(RdmaTransportTest, MoreRunsThanAnIntentPartHoldsLandThroughAGrantInParts) {
  for (auto* p : {src.get(), dst.get()})
    (void)p->segment().unlink();
  PoolGeometry big = kvrelay::testing::transport_geometry(/*head_dim=*/8);
  big.num_blocks = 4200;
  src = kvrelay::testing::make_test_pool("rdmatest", "bigsrc", big);
  dst = kvrelay::testing::make_test_pool("rdmatest", "bigdst", big);
  fill(*src);
  arrivals = std::make_shared<Arrivals>(dst->geometry(), nullptr);
  peer_timeout = 10s;  // 12,600 writes: not a lost peer, however slow the build
  listen();
  connect();
  auto dest = destination(receiver->port());
  ASSERT_TRUE(dest);
  // Every other block, reversed: 2,100 runs of one block (two intent parts).
  std::vector<uint32_t> src_ids, dst_ids;
  for (uint32_t b = 0; b < 2100; ++b) {
    src_ids.push_back(2 * b);
    dst_ids.push_back(4199 - 2 * b);
  }
  static_assert(kMaxIntentRuns < 2100);
  const auto done = send_all_layers(*dest, 1, src_ids, dst_ids);
  ASSERT_EQ(done.size(), 3u);
  for (const TransferCompletion& c : done)
    EXPECT_TRUE(c.status) << message(c);
  EXPECT_EQ(wrong_bytes(*dst, src_ids, dst_ids), 0u);
  EXPECT_EQ(fabric.writes.load(), 3u * 2100 * 2) << "one write per run and tensor";
  EXPECT_EQ(receiver->sessions().transfers.load(), 3u);
}

// Open transfers are capped by the bytes they hold granted, not only by
// their count: one that would pass the limit is refused naming it, and a
// grant is possible again once bytes land.
TEST_F(RdmaTransportTest, ASessionRefusesAGrantThatWouldPassItsGrantedBytes) {
  RdmaListener listener(&fabric, "", *dst, 0);
  const uint64_t block = dst->geometry().block_bytes(PoolTensor::kKey);
  const uint64_t per_block = block * dst->geometry().tensors_per_layer();
  listener.max_granted_bytes = 3 * per_block;  // three blocks of a layer
  Result<std::unique_ptr<RcQueuePair>> theirs = fabric.create_queue_pair();
  ASSERT_TRUE(theirs);
  const QpEndpoint offer[] = {(*theirs)->local()};
  Result<std::unique_ptr<RdmaSession>> session =
      RdmaSession::accept(listener, *arrivals, offer, "test peer", "p0");
  ASSERT_TRUE(session) << session.error().message;
  Intent part;
  part.layer = 0;
  part.last = true;
  part.transfer = 1;
  part.runs = {BlockSpan{0, 2}};
  Result<std::optional<std::vector<Grant>>> first = answer(**session, part);
  ASSERT_TRUE(first && *first && (*first)->front().ok) << "two blocks fit";
  part.transfer = 2;
  part.runs = {BlockSpan{4, 2}};
  Result<std::optional<std::vector<Grant>>> second = answer(**session, part);
  ASSERT_TRUE(second && *second);
  ASSERT_EQ((*second)->size(), 1u);
  ASSERT_FALSE((*second)->front().ok) << "four blocks would pass three";
  EXPECT_TRUE((*second)->front().last);
  EXPECT_NE((*second)->front().reason.find("bytes are granted on this session and not landed "
                                           "yet"),
            std::string::npos)
      << (*second)->front().reason;
  part.transfer = 3;
  part.runs = {BlockSpan{4, 1}};
  Result<std::optional<std::vector<Grant>>> third = answer(**session, part);
  ASSERT_TRUE(third && *third && (*third)->front().ok) << "one more block fits";
}

// A hostile receiver that grants a key fewer than the intent's runs and
// tensors: the sender writes nothing, ends the session, and the request
// fails naming the grant and its keys.
TEST_F(RdmaTransportTest, AGrantWithAKeyMissingEndsTheSessionBeforeAnyWrite) {
  listen();
  rdma_listener->tamper_grants = [](std::vector<Grant>& grants) {
    for (Grant& g : grants)
      if (g.ok && g.last && !g.rkeys.empty()) g.rkeys.pop_back();
  };
  connect();
  auto dest = destination(receiver->port());
  ASSERT_TRUE(dest);
  const auto done = send_all_layers(*dest, 1, {1, 2, 5}, {3, 4, 9});
  ASSERT_EQ(done.size(), 3u);
  for (const TransferCompletion& c : done) ASSERT_FALSE(c.status);
  const std::string why = message(done[0]) + message(done[1]) + message(done[2]);
  EXPECT_NE(why.find("holds 3 keys, not one per run"), std::string::npos) << why;
  EXPECT_EQ(fabric.writes.load(), 0u) << "nothing written under a short grant";
}

TEST_F(RdmaTransportTest, AListenerWithoutRdmaRefusesTheOfferSayingSo) {
  listen(/*with_rdma=*/false);
  connect();
  auto dest = destination(receiver->port());
  ASSERT_TRUE(dest);
  const auto done = send_all_layers(*dest, 1, {1}, {1});
  ASSERT_EQ(done.size(), 3u);
  ASSERT_FALSE(done[0].status);
  EXPECT_NE(message(done[0]).find("does not accept rdma"), std::string::npos) << message(done[0]);
  EXPECT_EQ(fabric.writes.load(), 0u);
}

TEST_F(RdmaTransportTest, WithoutADeviceRdmaIsRefusedAtOnceWithTheReason) {
  connect(nullptr, "rank 0 has no RDMA device: no RDMA device on this host");
  Result<std::shared_ptr<Destination>> dest = resolve(1234);
  ASSERT_FALSE(dest);
  EXPECT_NE(dest.error().message.find("no RDMA device on this host"), std::string::npos);
}

}  // namespace
}  // namespace kvrelay::worker::rdma

namespace kvrelay::worker::rdma {
namespace {

// Heterogeneous TP over rdma: a prefill rank of tp 1 holding both of the
// model's 2 KV heads writes head 0 into decode rank 0 and head 1 into decode
// rank 1 (decode tp 2, one head each), one write per block and tensor, and
// each decode rank's expected request arrives once its head has landed.
TEST(RdmaHeteroTp, EachDecodeRankGetsItsHeadAndItsRequestArrives) {
  FakeFabric fabric;
  net::NetThread net;
  const AuthKey key = AuthKey::from_bytes(std::vector<uint8_t>(32, 7));
  PoolGeometry one_head = kvrelay::testing::transport_geometry();
  one_head.kv_heads = 1;
  auto src = kvrelay::testing::make_test_pool("rdmahet", "src",
                                              kvrelay::testing::transport_geometry());
  kvrelay::testing::fill(*src);
  std::vector<std::unique_ptr<HostSegmentPool>> dst;
  std::vector<std::shared_ptr<Arrivals>> arrivals;
  std::vector<std::unique_ptr<Receiver>> receivers;
  capnp::MallocMessageBuilder m;
  auto d = m.initRoot<schema::CacheDest>();
  d.setProtocol(schema::TransferProtocol::RDMA);
  d.setPeerAddress("127.0.0.1");
  d.setPeerInstance("d");
  auto ports = d.initRdmaPorts(2);
  const std::vector<uint32_t> src_ids = {3, 4, 9}, dst_ids = {7, 8, 20};
  for (uint32_t r = 0; r < 2; ++r) {
    dst.push_back(kvrelay::testing::make_test_pool("rdmahet", fmt::format("dst{}", r), one_head));
    arrivals.push_back(std::make_shared<Arrivals>(one_head, nullptr));
    ASSERT_TRUE(arrivals[r]->expect(40 + r, "het", dst_ids));
    ReceiverOptions o;
    o.instance = "d";
    o.rank = r;
    o.heads = HeadLayout{2, 1, 2};
    o.arrivals = arrivals[r];
    o.rdma = std::make_shared<RdmaListener>(&fabric, "", *dst[r], r);
    Result<std::unique_ptr<Receiver>> rx = Receiver::start(net, *dst[r], key, o);
    ASSERT_TRUE(rx) << rx.error().message;
    receivers.push_back(std::move(rx).value());
    ports.set(r, receivers[r]->port());
  }
  RdmaSenderOptions o;
  o.instance = "p";
  o.tp_size = 1;
  o.total_kv_heads = 2;
  RdmaTransport sender(net, *src, &key, &fabric, "", o, nullptr);
  Result<std::shared_ptr<Destination>> dest = sender.resolve(d.asReader());
  ASSERT_TRUE(dest) << dest.error().message;
  EXPECT_EQ((*dest)->transfers_per_submit(), 2u);
  EXPECT_EQ((*dest)->peer(), "decode ranks 0,1 at 127.0.0.1 over rdma (tp 1 -> tp 2)");
  const auto done = kvrelay::testing::send_all_layers(sender, **dest, 3, 1, src_ids, dst_ids,
                                                      request_key("het"));
  ASSERT_EQ(done.size(), 6u) << "one completion per layer and decode rank";
  for (const TransferCompletion& c : done) EXPECT_TRUE(c.status) << c.status.error().message;
  for (uint32_t r = 0; r < 2; ++r) {
    EXPECT_EQ(kvrelay::testing::wrong_head_bytes(*src, r, *dst[r], 0, 1, src_ids, dst_ids), 0u)
        << "decode rank " << r;
    const auto events = arrivals[r]->take();
    ASSERT_EQ(events.size(), 1u) << "decode rank " << r;
    EXPECT_EQ(events[0].kind, ArrivalEvent::kArrived);
  }
  EXPECT_EQ(fabric.writes.load(), 3u * 2 * 2 * 3) << "a write per block, tensor, rank and layer";
  receivers.clear();
  for (auto& p : dst) (void)p->segment().unlink();
  (void)src->segment().unlink();
}

}  // namespace
}  // namespace kvrelay::worker::rdma
