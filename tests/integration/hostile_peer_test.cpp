// A peer that holds the key and still misbehaves, against real coordinator
// and worker processes on loopback: it can hold neither a withdrawal nor a
// rank hostage. A decode rank abandons a payload that stops coming once its
// request is cancelled; a prefill rank gives up on a receiver that never
// acks, naming it; neither rank is killed for it, and nothing else fails.
#include <gtest/gtest.h>

#include <thread>

#include "../worker/raw_net_client.h"
#include "integration/dump_json.h"
#include "integration/two_instances.h"
#include "two_hosts.h"
#include "worker/net/listener.h"
#include "worker/request_key.h"
#include "worker/tcp/frame_wire.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

uint64_t coordinator_counter(const std::string& instance, const std::string& label) {
  const auto j = dump_json(instance);
  return j.is_discarded() ? 0 : j["coordinator"]["counters"].value(label, uint64_t{0});
}

// The decode engine declares a request; a keyed peer sends half of a frame
// for it, then a byte every 300 ms (enough for any silence watch). The
// engine cancels: the withdrawal must be confirmed at once (the rank drops
// the connection that holds the payload), not by killing the rank.
TEST(HostilePeer, ATricklingPayloadCannotHoldACancelledRequestsWithdrawal) {
  sim::TemporaryKey key;
  ASSERT_FALSE(key.path().empty());
  const std::vector<uint16_t> ports = sim::free_tcp_ports(1, "127.0.0.1");
  ASSERT_EQ(ports.size(), 1u);
  InstanceArgs a;
  a.instance = unique_instance("hostile-d");
  a.role = "decode";
  a.layers = 2;
  a.blocks = 32;
  a.extra = {"--protocol",      "ipc,tcp", "--tcp-ports", std::to_string(ports[0]),
             "--auth-key-file", key.path()};
  auto decode = Instance::start(a);
  const uint32_t worker = worker_pid(decode->name(), 0);
  Result<PoolView> pool = decode->client().open_pool(0, PoolTier::kDevice);
  ASSERT_TRUE(pool);
  const PoolGeometry g = pool->geometry();

  ExpectSpec e;
  e.request_id = "held";
  e.dest_block_ids = {3};
  ASSERT_TRUE(decode->client().submit(e, Deadline::after(5s)).ok());

  Result<AuthKey> k = AuthKey::load(key.path());
  ASSERT_TRUE(k);
  RawNetClient peer(ports[0]);
  Result<worker::net::Inbound> ack = peer.authenticate(*k, RawNetClient::raw_hello(g));
  ASSERT_TRUE(ack && ack->hello_ack.accepted)
      << (ack ? ack->hello_ack.reason : ack.error().message);
  worker::tcp::FrameHeader f;
  f.transfer = 1;
  f.request_key = worker::request_key("held");
  f.dst_offset = 3 * g.block_bytes(PoolTensor::kKey);
  f.bytes = g.block_bytes(PoolTensor::kKey);
  f.last = true;
  std::vector<std::byte> out;
  worker::tcp::encode_frame(f, out);
  peer.send(std::move(out));
  const std::vector<std::byte> half(f.bytes / 2, std::byte{0x51});
  peer.write_raw(half);  // the payload's first half (a record not yet tagged)
  std::atomic<bool> trickling{true};
  std::thread trickle([&] {
    const std::byte one[1] = {std::byte{0x51}};
    while (trickling) {
      std::this_thread::sleep_for(300ms);
      if (::send(peer.socket().native_handle(), one, 1, MSG_NOSIGNAL) < 0) break;
    }
  });
  std::this_thread::sleep_for(700ms);  // the trickle is well under way
  const auto cancelled_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(decode->client().cancel("held", Deadline::after(5s)).ok());
  Result<Completion> c = decode->client().wait(Deadline::after(10s));
  const auto took = std::chrono::steady_clock::now() - cancelled_at;
  trickling = false;
  trickle.join();
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->request_id, "held");
  EXPECT_EQ(c->status, CompletionStatus::kCancelled) << c->message;
  EXPECT_TRUE(c->blocks_reusable) << "the rank confirmed it: " << c->message;
  EXPECT_LT(took, 2s) << "confirmed by the rank, before the coordinator would kill it";
  EXPECT_EQ(worker_pid(decode->name(), 0), worker) << "the rank was not restarted";
  EXPECT_EQ(coordinator_counter(decode->name(), "workers_lost"), 0u);
  EXPECT_EQ(decode->stop(), 0);
}

// A handler for tcp frames that reads each payload and never answers.
class NeverAcks final : public worker::net::MessageHandler {
 public:
  explicit NeverAcks(worker::net::ServerLink& link) : link_(link) {}
  void on_message(const worker::net::Inbound& in) override {
    Result<worker::tcp::Message> m = worker::tcp::decode(in);
    if (!m) return link_.close(m.error().message);
    link_.discard_payload(m->frame.bytes, [this] { link_.read_next(); });
  }
  void on_closed(const std::string&) override {}

 private:
  worker::net::ServerLink& link_;
};

// A keyed receiver takes every byte and never acks. The prefill rank must
// fail the transfer, naming the peer and the missing ack, within about the
// peer timeout; a cancelled request's withdrawal is confirmed by the rank;
// the rank is never killed for it.
TEST(HostilePeer, AReceiverThatNeverAcksCostsItsConnectionNotTheRank) {
  sim::TemporaryKey key;
  ASSERT_FALSE(key.path().empty());
  Result<AuthKey> k = AuthKey::load(key.path());
  ASSERT_TRUE(k);
  InstanceArgs a;
  a.instance = unique_instance("hostile-p");
  a.role = "prefill";
  a.layers = 2;
  a.blocks = 32;
  a.extra = {"--protocol", "ipc,tcp", "--auth-key-file", key.path()};
  auto prefill = Instance::start(a);
  const uint32_t worker = worker_pid(prefill->name(), 0);
  Result<PoolView> pool = prefill->client().open_pool(0, PoolTier::kDevice);
  ASSERT_TRUE(pool);
  worker::net::NetThread net(2);
  worker::net::ListenerOptions o;
  o.instance = "sink";
  o.pool = pool->geometry();
  worker::net::HandlerFactory f;
  f.protocol = worker::tcp::kProtocol;
  f.name = "frames, never acked";
  f.make = [](worker::net::ServerLink& link) -> std::unique_ptr<worker::net::MessageHandler> {
    return std::make_unique<NeverAcks>(link);
  };
  o.handlers.push_back(f);
  Result<std::unique_ptr<worker::net::Listener>> sink = worker::net::Listener::start(net, *k, o);
  ASSERT_TRUE(sink) << sink.error().message;
  const uint16_t port = (*sink)->port();

  auto send = [&](const std::string& id, uint32_t block, uint64_t step) {
    CacheTaskSpec t;
    t.request_id = id;
    t.src_block_ids = {block};
    t.need_prefill_tokens = 16;
    t.engine_slot = block;
    ASSERT_TRUE(prefill->client().submit(t, Deadline::after(5s)).ok());
    CacheDestSpec d;
    d.request_id = id;
    d.dest_block_ids = {block};
    d.protocol = Protocol::kTcp;
    d.peer_address = "127.0.0.1";
    d.tcp_ports = {port};
    ASSERT_TRUE(prefill->client().submit(d, Deadline::after(5s)).ok());
    const std::vector<BatchSlot> batch = {{block, 0, 16, Client::request_tag(id)}};
    ASSERT_TRUE(prefill->client().push_batch(0, step, batch, Deadline::after(5s)).ok());
    for (uint32_t l = 0; l < 2; ++l)
      ASSERT_TRUE(prefill->client().push_layer_done(0, step, l, Deadline::after(5s)).ok());
  };
  send("unacked", 1, 1);
  Result<Completion> failed = prefill->client().wait(Deadline::after(10s));
  ASSERT_TRUE(failed) << failed.error().message;
  EXPECT_EQ(failed->request_id, "unacked");
  EXPECT_EQ(failed->status, CompletionStatus::kError);
  EXPECT_NE(failed->message.find("no ack for layer"), std::string::npos) << failed->message;
  EXPECT_NE(failed->message.find(fmt::format("127.0.0.1:{}", port)), std::string::npos)
      << "names the peer: " << failed->message;

  send("cancelled", 2, 2);
  std::this_thread::sleep_for(100ms);
  const auto cancelled_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(prefill->client().cancel("cancelled", Deadline::after(5s)).ok());
  Result<Completion> c = prefill->client().wait(Deadline::after(10s));
  ASSERT_TRUE(c) << c.error().message;
  EXPECT_EQ(c->request_id, "cancelled");
  EXPECT_TRUE(c->blocks_reusable) << c->message;
  EXPECT_LT(std::chrono::steady_clock::now() - cancelled_at, 2s);
  EXPECT_EQ(worker_pid(prefill->name(), 0), worker) << "the rank was not restarted";
  EXPECT_EQ(coordinator_counter(prefill->name(), "workers_lost"), 0u);
  sink->reset();
  EXPECT_EQ(prefill->stop(), 0);
}

}  // namespace
}  // namespace kvrelay::testing
