// The tcp transport between real processes on two hosts (two network
// namespaces joined by a veth pair; loopback addresses where namespaces
// cannot be made): a decode worker killed mid-transfer, the link taken down
// mid-transfer, a wrong key, and connect tasks. Every request gets exactly
// one completion, failures name the prefill rank and the decode peer,
// nothing outside a request's destination blocks changes, and the next
// requests go through once the peer is back. Detection times are logged and
// asserted with generous bounds (these machines are noisy).
#include <gtest/gtest.h>
#include <signal.h>

#include <set>
#include <thread>

#include "integration/tcp_hosts.h"
#include "shm/control_segment.h"
#include "shm/liveness.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kLayers = 4;
constexpr uint32_t kBlockTokens = 16;

InstanceArgs args() {
  InstanceArgs a;
  a.tp = 2;
  a.layers = kLayers;
  a.blocks = 128;
  a.block_size = kBlockTokens;
  a.head_dim = 64;
  return a;
}

class TcpFaults : public ::testing::Test {
 protected:
  void start(const std::string& prefill_key = "") {
    env = std::make_unique<TwoInstances>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), args(),
        hosts.placement(prefill_key));
    env->set_route(hosts.route());
    for (uint32_t rank = 0; rank < env->tp(); ++rank) {
      const HostPool& dst = env->dst_pool(rank);
      for (uint32_t l = 0; l < kLayers; ++l)
        for (uint32_t t = 0; t < 2; ++t)
          for (uint32_t b = 0; b < dst.geometry().num_blocks; ++b)
            sim::poison_block(dst, l, t, b);
    }
  }
  void TearDown() override {
    if (env) env->stop_and_check_clean();
  }

  // A request of `n` blocks, all filled on the prefill side.
  sim::RequestBlocks blocks(uint32_t n) {
    sim::RequestBlocks r;
    r.tag = ++next_tag;
    for (uint32_t i = 0; i < n; ++i) {
      r.src.push_back(next_src++);
      r.dst.push_back(next_dst++);
    }
    env->fill(r);
    return r;
  }
  void submit(const std::string& id, const sim::RequestBlocks& r, uint32_t slot) {
    ASSERT_TRUE(env->submit_task(id, r, r.src.size() * kBlockTokens, slot));
    ASSERT_TRUE(env->submit_dest(id, r));
    current_step = ++step;
    const std::vector<BatchSlot> batch = {
        {slot, 0, static_cast<uint32_t>(r.src.size() * kBlockTokens), Client::request_tag(id)}};
    for (uint32_t rank = 0; rank < env->tp(); ++rank)
      ASSERT_TRUE(env->engine().push_batch(rank, current_step, batch, Deadline::after(5s)));
  }
  void layers_done(uint32_t from, uint32_t to) {
    for (uint32_t l = from; l < to; ++l)
      for (uint32_t rank = 0; rank < env->tp(); ++rank)
        ASSERT_TRUE(env->engine().push_layer_done(rank, current_step, l, Deadline::after(5s)));
  }
  // Destination blocks outside every finished request still hold poison.
  uint64_t stray_writes(const std::vector<sim::RequestBlocks>& finished) {
    std::set<uint32_t> owned;
    for (const auto& r : finished)
      owned.insert(r.dst.begin(), r.dst.end());
    uint64_t stray = 0;
    for (uint32_t rank = 0; rank < env->tp(); ++rank)
      for (uint32_t l = 0; l < kLayers; ++l)
        for (uint32_t t = 0; t < 2; ++t)
          for (uint32_t b = next_dst; b < env->dst_pool(rank).geometry().num_blocks; ++b)
            if (owned.count(b) == 0 && !sim::block_is_poisoned(env->dst_pool(rank), l, t, b))
              ++stray;
    return stray;
  }
  // Sends fresh requests until one finishes (the peer may still be coming
  // back: each attempt gets one completion); returns whether one did.
  bool a_new_request_goes_through(const std::string& prefix) {
    for (int attempt = 0; attempt < 20; ++attempt) {
      const std::string id = prefix + std::to_string(attempt);
      sim::RequestBlocks r = blocks(2);
      submit(id, r, 1);
      layers_done(0, kLayers);
      const Completion c = env->wait_for(id, 20s);
      if (c.status == CompletionStatus::kFinished) return env->wrong_words(r) == 0;
      std::this_thread::sleep_for(300ms);
    }
    return false;
  }
  pid_t decode_worker_pid(uint32_t rank) {
    auto c = ControlSegment::attach(env->decode().name(),
                                    AttachOptions{.access = SegmentAccess::kReadOnly});
    if (!c) return -1;
    return static_cast<pid_t>(read_slot(c->worker_slot(rank)).owner.pid);
  }

  TcpHosts hosts{"tflt", 2};
  std::unique_ptr<TwoInstances> env;
  uint64_t next_tag = 0;
  uint32_t next_src = 0, next_dst = 0;
  uint64_t step = 0, current_step = 0;
};

TEST_F(TcpFaults, AKilledDecodeWorkerFailsItsRequestOnceNamingThePeerAndTheNextOnesGoThrough) {
  start();
  sim::RequestBlocks r = blocks(4);
  submit("victim", r, 0);
  layers_done(0, 1);  // layer 0 moves on both ranks
  std::this_thread::sleep_for(100ms);
  const pid_t pid = decode_worker_pid(0);
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  const auto killed = Clock::now();
  layers_done(1, kLayers);
  const Completion c = env->wait_for("victim", 20s);
  const auto noticed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed);
  std::cerr << "[ measured ] decode worker SIGKILLed -> error completion: " << noticed.count()
            << " ms\n";
  EXPECT_EQ(c.status, CompletionStatus::kError) << c.message;
  EXPECT_EQ(c.error_rank, 0);
  EXPECT_NE(c.message.find("rank 0:"), std::string::npos) << c.message;
  EXPECT_NE(c.message.find("decode rank 0 at " + hosts.hosts().address_b()), std::string::npos)
      << c.message;
  EXPECT_LT(noticed, 2000ms) << "target: 100 ms after the signals that need the peer";
  EXPECT_EQ(env->wait_for("victim", 300ms).message.rfind("no completion", 0), 0u)
      << "exactly one completion";
  EXPECT_TRUE(a_new_request_goes_through("after-kill-"));
  EXPECT_EQ(stray_writes({}), 0u);
}

TEST_F(TcpFaults, APartitionIsNoticedWithinASecondAndTheLinkServesAgainOnceUp) {
  if (!hosts.hosts().isolated())
    GTEST_SKIP() << "needs two network namespaces to take a link down: "
                 << hosts.hosts().why_not_isolated();
  start();
  sim::RequestBlocks r = blocks(4);
  submit("cut-off", r, 0);
  layers_done(0, 1);
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(hosts.hosts().set_link(false));
  const auto cut = Clock::now();
  layers_done(1, kLayers);
  const Completion c = env->wait_for("cut-off", 20s);
  const auto noticed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - cut);
  std::cerr << "[ measured ] link down -> error completion: " << noticed.count() << " ms\n";
  EXPECT_EQ(c.status, CompletionStatus::kError) << c.message;
  EXPECT_NE(c.message.find("decode rank"), std::string::npos) << c.message;
  EXPECT_LT(noticed, 3000ms) << "target: 1 s";
  EXPECT_EQ(env->wait_for("cut-off", 300ms).message.rfind("no completion", 0), 0u);
  ASSERT_TRUE(hosts.hosts().set_link(true));
  EXPECT_TRUE(a_new_request_goes_through("after-partition-"));
  EXPECT_EQ(stray_writes({}), 0u);
}

TEST_F(TcpFaults, AWrongKeyIsRefusedAndNoDecodeByteChanges) {
  sim::TemporaryKey other;
  start(other.path());
  sim::RequestBlocks r = blocks(3);
  submit("wrong-key", r, 0);
  layers_done(0, kLayers);
  const Completion c = env->wait_for("wrong-key", 20s);
  EXPECT_EQ(c.status, CompletionStatus::kError);
  EXPECT_NE(c.message.find("authentication failed"), std::string::npos) << c.message;
  for (uint32_t rank = 0; rank < env->tp(); ++rank)
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t b : r.dst)
        EXPECT_TRUE(sim::block_is_poisoned(env->dst_pool(rank), l, 0, b));
  ConnectSpec connect;
  connect.task_id = 7;
  connect.protocol = Protocol::kTcp;
  connect.peer_address = hosts.route().address;
  connect.ports = hosts.route().ports;
  ASSERT_TRUE(env->engine().submit(connect, Deadline::after(5s)));
  const Completion refused = env->wait_for("connect-7", 20s);
  EXPECT_EQ(refused.status, CompletionStatus::kError);
  EXPECT_NE(refused.message.find("authentication failed"), std::string::npos) << refused.message;
}

TEST_F(TcpFaults, AConnectTaskShakesHandsOnEveryRank) {
  start();
  ConnectSpec connect;
  connect.task_id = 8;
  connect.protocol = Protocol::kTcp;
  connect.peer_address = hosts.route().address;
  connect.ports = hosts.route().ports;
  connect.peer_instance = env->decode().name();
  ASSERT_TRUE(env->engine().submit(connect, Deadline::after(5s)));
  const Completion ok = env->wait_for("connect-8", 20s);
  EXPECT_EQ(ok.status, CompletionStatus::kFinished) << ok.message;
  connect.task_id = 9;
  connect.peer_instance = "not-" + env->decode().name();  // the listener says who it is
  ASSERT_TRUE(env->engine().submit(connect, Deadline::after(5s)));
  const Completion wrong = env->wait_for("connect-9", 20s);
  EXPECT_EQ(wrong.status, CompletionStatus::kError);
  // (The message is capped; test instance names are long.)
  EXPECT_NE(wrong.message.find("the receiver refused the connection: this is instance '"),
            std::string::npos)
      << wrong.message;
}

// ---- expected requests: the decode engine's own completion ----

TEST_F(TcpFaults, TheDecodeEngineLearnsItsKvArrivedExactlyOnce) {
  start();
  sim::RequestBlocks r = blocks(4);
  Client& decode_engine = env->decode().client();
  ASSERT_TRUE(decode_engine.submit(ExpectSpec{"arrive", r.dst, 20'000}, Deadline::after(5s)));
  submit("arrive", r, 0);
  layers_done(0, kLayers);
  const Completion sent = env->wait_for("arrive");
  EXPECT_EQ(sent.status, CompletionStatus::kFinished) << sent.message;
  Result<Completion> here = decode_engine.wait(Deadline::after(10s));
  ASSERT_TRUE(here) << here.error().message;
  EXPECT_EQ(here->request_id, "arrive");
  EXPECT_EQ(here->kind, CompletionKind::kArrived);
  EXPECT_EQ(here->status, CompletionStatus::kFinished) << here->message;
  const uint64_t block = env->dst_pool(0).geometry().block_bytes(PoolTensor::kKey);
  EXPECT_EQ(here->bytes_moved, r.dst.size() * kLayers * 2 * block * env->tp());
  EXPECT_EQ(env->wrong_words(r), 0u);
  EXPECT_EQ(decode_engine.wait(Deadline::after(300ms)).code(), Errc::kTimeout)
      << "exactly one completion";
}

TEST_F(TcpFaults, AnExpectedRequestThatNeverComesTimesOut) {
  start();
  sim::RequestBlocks r = blocks(2);
  Client& decode_engine = env->decode().client();
  const auto t0 = Clock::now();
  ASSERT_TRUE(decode_engine.submit(ExpectSpec{"never", r.dst, 500}, Deadline::after(5s)));
  Result<Completion> here = decode_engine.wait(Deadline::after(10s));
  ASSERT_TRUE(here) << here.error().message;
  EXPECT_EQ(here->kind, CompletionKind::kArrived);
  EXPECT_EQ(here->status, CompletionStatus::kTimeout) << here->message;
  EXPECT_LT(Clock::now() - t0, 5s);
  // Its blocks are free again, and its own frames, late, are refused.
  submit("never", r, 0);
  layers_done(0, kLayers);
  const Completion late = env->wait_for("never");
  EXPECT_EQ(late.status, CompletionStatus::kError);
  EXPECT_NE(late.message.find("withdrawn"), std::string::npos) << late.message;
  EXPECT_EQ(stray_writes({}), 0u);
}

TEST_F(TcpFaults, FramesIntoBlocksAnotherRequestDeclaredAreRefusedAndThatRequestStillArrives) {
  start();
  sim::RequestBlocks owner = blocks(3);
  sim::RequestBlocks intruder = blocks(3);
  intruder.dst = owner.dst;  // a buggy engine sends another request into them
  Client& decode_engine = env->decode().client();
  ASSERT_TRUE(decode_engine.submit(ExpectSpec{"owner", owner.dst, 20'000}, Deadline::after(5s)));
  submit("intruder", intruder, 0);
  layers_done(0, kLayers);
  const Completion refused = env->wait_for("intruder");
  EXPECT_EQ(refused.status, CompletionStatus::kError);
  EXPECT_NE(refused.message.find("which request 'owner' declared"), std::string::npos)
      << refused.message;
  for (uint32_t rank = 0; rank < env->tp(); ++rank)
    for (uint32_t b : owner.dst)
      EXPECT_TRUE(sim::block_is_poisoned(env->dst_pool(rank), 0, 0, b)) << "nothing written";
  submit("owner", owner, 1);
  layers_done(0, kLayers);
  EXPECT_EQ(env->wait_for("owner").status, CompletionStatus::kFinished);
  Result<Completion> here = decode_engine.wait(Deadline::after(10s));
  ASSERT_TRUE(here) << here.error().message;
  EXPECT_EQ(here->request_id, "owner");
  EXPECT_EQ(here->status, CompletionStatus::kFinished) << here->message;
  EXPECT_EQ(env->wrong_words(owner), 0u);
}

}  // namespace
}  // namespace kvrelay::testing
