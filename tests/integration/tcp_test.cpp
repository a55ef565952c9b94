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

#include <thread>

#include "instance/control_segment.h"
#include "integration/request_driver.h"
#include "integration/tcp_hosts.h"
#include "shm/liveness.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

InstanceArgs tcp_pair_args() {
  return RequestDriver::small_pair();
}

// A worker counter summed over an instance's ranks, once it has reached
// `at_least` (the workers copy their network counts into shared memory once
// a turn, so a count can trail the completion it belongs to), or as it is
// after 10 s.
uint64_t worker_counter_once(const std::string& instance, const std::string& label,
                             uint64_t at_least) {
  const Deadline until = Deadline::after(10s);
  uint64_t v = worker_counter_sum(instance, label);
  while (v < at_least && !until.passed()) {
    std::this_thread::sleep_for(5ms);
    v = worker_counter_sum(instance, label);
  }
  return v;
}

std::string dump_text(const std::string& instance) {
  int code = -1;
  std::string out = kvrelay_dump({instance}, &code);
  EXPECT_EQ(code, 0) << out;
  return out;
}

class TcpFaults : public ::testing::Test {
 protected:
  void start(const std::string& prefill_key = "") {
    env = std::make_unique<TwoInstances>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), tcp_pair_args(),
        hosts.placement(prefill_key));
    env->set_route(hosts.route());
    driver = std::make_unique<RequestDriver>(*env, RequestDriver::kLayers, RequestDriver::kBlockTokens);
  }
  void TearDown() override {
    driver.reset();
    if (env) env->stop_and_check_clean();
  }

  sim::RequestBlocks blocks(uint32_t n) { return driver->blocks(n); }
  void submit(const std::string& id, const sim::RequestBlocks& r, uint32_t slot) {
    driver->submit(id, r, slot);
  }
  void layers_done(uint32_t from, uint32_t to) { driver->layers_done(from, to); }
  uint64_t stray_writes(const std::vector<sim::RequestBlocks>& finished) {
    return driver->stray_writes(finished);
  }
  bool a_new_request_goes_through(const std::string& prefix) {
    return driver->a_new_request_goes_through(prefix);
  }
  pid_t decode_worker_pid(uint32_t rank) {
    auto c = ControlSegment::attach(env->decode().name(),
                                    AttachOptions{.access = SegmentAccess::kReadOnly});
    if (!c) return -1;
    return static_cast<pid_t>(read_slot(c->worker_slot(rank)).owner.pid);
  }

  TcpHosts hosts{"tflt", 2};
  std::unique_ptr<TwoInstances> env;
  std::unique_ptr<RequestDriver> driver;
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
  layers_done(1, RequestDriver::kLayers);
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
  // A lane that had served counts as lost; one still shaking hands when the
  // worker died (a slow machine: layer 0 may not have moved yet) as a
  // failed attempt. Either way the kill shows, once the worker mirrored it.
  const auto lanes_gone = [&] {
    return worker_counter_sum(env->prefill().name(), "tcp_lanes_lost") +
           worker_counter_sum(env->prefill().name(), "tcp_connect_failures");
  };
  const Deadline until = Deadline::after(10s);
  while (lanes_gone() == 0 && !until.passed())
    std::this_thread::sleep_for(5ms);
  EXPECT_GE(lanes_gone(), 1u)
      << "the lanes to the killed worker count as lost or as failed attempts";
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
  layers_done(1, RequestDriver::kLayers);
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
  layers_done(0, RequestDriver::kLayers);
  const Completion c = env->wait_for("wrong-key", 20s);
  EXPECT_EQ(c.status, CompletionStatus::kError);
  EXPECT_NE(c.message.find("authentication failed"), std::string::npos) << c.message;
  for (uint32_t rank = 0; rank < env->tp(); ++rank)
    for (uint32_t l = 0; l < RequestDriver::kLayers; ++l)
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
  EXPECT_GE(worker_counter_once(env->decode().name(), "net_connections_refused", 1), 1u);
  EXPECT_GE(worker_counter_once(env->prefill().name(), "tcp_connect_failures", 1), 1u);
  EXPECT_EQ(worker_counter_sum(env->decode().name(), "net_connections_accepted"), 0u);
  EXPECT_EQ(worker_counter_sum(env->decode().name(), "tcp_frames_received"), 0u);
  EXPECT_EQ(worker_counter_sum(env->prefill().name(), "tcp_lanes_opened"), 0u);
  const std::string out = dump_text(env->decode().name());
  EXPECT_NE(out.find("receives  connections accepted 0  refused "), std::string::npos) << out;
}

// What each side counts of the network: the decode ranks received exactly
// the bytes the prefill ranks sent, over as many connections as those
// opened, none refused or lost; kvrelay-dump shows both sides.
TEST_F(TcpFaults, BothSidesCountTheSameTrafficAndTheDumpShowsIt) {
  start();
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(a_new_request_goes_through("counted-" + std::to_string(i) + "-"));
  const std::string prefill = env->prefill().name(), decode = env->decode().name();
  // Each worker mirrors its counters on its own turn, after the completion
  // may already be out: wait until both sides have counted everything (the
  // two agree and stay so), rather than read a counter that lags.
  uint64_t sent = 0, received = 0;
  const Deadline until = Deadline::after(10s);
  for (int agreed = 0; agreed < 3 && !until.passed(); std::this_thread::sleep_for(20ms)) {
    sent = worker_counter_sum(prefill, "bytes_copied");
    received = worker_counter_sum(decode, "tcp_bytes_received");
    agreed = sent > 0 && sent == received ? agreed + 1 : 0;
  }
  ASSERT_GT(sent, 0u);
  EXPECT_EQ(received, sent);
  EXPECT_GE(worker_counter_sum(decode, "tcp_frames_received"),
            3ull * RequestDriver::kLayers * env->tp());
  const uint64_t lanes = 2ull * env->tp();  // --tcp-lanes 2 (the default) per rank
  EXPECT_EQ(worker_counter_once(prefill, "tcp_lanes_opened", lanes), lanes);
  EXPECT_EQ(worker_counter_once(decode, "net_connections_accepted", lanes), lanes);
  for (const char* none : {"tcp_frames_refused", "net_connections_refused"})
    EXPECT_EQ(worker_counter_sum(decode, none), 0u) << none;
  for (const char* none : {"tcp_lanes_lost", "tcp_connect_failures", "rdma_sessions_opened"})
    EXPECT_EQ(worker_counter_sum(prefill, none), 0u) << none;
  const std::string sender = dump_text(prefill);
  EXPECT_NE(sender.find("rank 0 sends     tcp lanes opened"), std::string::npos) << sender;
  EXPECT_EQ(sender.find("rank 0 receives"), std::string::npos) << "a prefill rank receives nothing";
  const std::string receiver = dump_text(decode);
  EXPECT_NE(receiver.find("rank 1 receives  connections accepted"), std::string::npos) << receiver;
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

}  // namespace
}  // namespace kvrelay::testing
