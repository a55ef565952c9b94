// The request lifecycle across real processes: a prefill and a
// decode instance, each a coordinator with tp workers, driven through the
// client library. tp = 1, 2 and 4.
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "integration/two_instances.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kLifecycleLayers = 4;
constexpr uint32_t kLifecycleBlockTokens = 16;

class Lifecycle : public ::testing::TestWithParam<uint32_t> {
 protected:
  void SetUp() override {
    InstanceArgs a;
    a.tp = GetParam();
    a.layers = kLifecycleLayers;
    a.block_size = kLifecycleBlockTokens;
    env_ = std::make_unique<TwoInstances>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), a);
  }
  void TearDown() override {
    if (env_) env_->stop_and_check_clean();
  }
  // A 3-block request: src 5,6,7 -> dst 20,21,22.
  sim::RequestBlocks blocks(uint64_t tag) {
    return sim::RequestBlocks{tag, {5, 6, 7}, {20, 21, 22}};
  }
  std::unique_ptr<TwoInstances> env_;
};

std::string name_of(const ::testing::TestParamInfo<uint32_t>& p) {
  return "tp" + std::to_string(p.param);
}

TEST_P(Lifecycle, TaskThenDestMovesEveryByteAndFinishesOnce) {
  auto r = blocks(1);
  env_->fill(r);
  ASSERT_TRUE(env_->submit_task("req-a", r, 3 * kLifecycleBlockTokens, 0).ok());
  ASSERT_TRUE(env_->submit_dest("req-a", r).ok());
  env_->prefill_step(1, {{0, 0, 3 * kLifecycleBlockTokens}}, kLifecycleLayers);
  const Completion c = env_->wait_for("req-a");
  EXPECT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  EXPECT_EQ(env_->wrong_words(r), 0u);
  EXPECT_GT(c.bytes_moved, 0u);
  // When the first copy began: after the request reached the coordinator,
  // before it completed.
  EXPECT_GE(c.first_copy_ns, c.submitted_ns);
  EXPECT_LE(c.first_copy_ns, c.completed_ns);
  EXPECT_TRUE(env_->others().empty());
}

TEST_P(Lifecycle, DestThenTaskMovesEveryByteAndFinishesOnce) {
  auto r = blocks(2);
  env_->fill(r);
  ASSERT_TRUE(env_->submit_dest("req-b", r).ok());
  ASSERT_TRUE(env_->submit_task("req-b", r, 3 * kLifecycleBlockTokens, 1).ok());
  env_->prefill_step(1, {{1, 0, 3 * kLifecycleBlockTokens}}, kLifecycleLayers);
  const Completion c = env_->wait_for("req-b");
  EXPECT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  EXPECT_EQ(env_->wrong_words(r), 0u);
}

TEST_P(Lifecycle, DuplicateRequestIdIsRejectedAndTheFirstStillFinishes) {
  auto r = blocks(3);
  env_->fill(r);
  ASSERT_TRUE(env_->submit_task("dup", r, 3 * kLifecycleBlockTokens, 0).ok());
  ASSERT_TRUE(env_->submit_task("dup", r, 3 * kLifecycleBlockTokens, 0).ok());
  const Completion rejected = env_->wait_for("dup");
  EXPECT_EQ(rejected.status, CompletionStatus::kRejected);
  EXPECT_NE(rejected.message.find("duplicate"), std::string::npos);
  ASSERT_TRUE(env_->submit_dest("dup", r).ok());
  env_->prefill_step(1, {{0, 0, 3 * kLifecycleBlockTokens}}, kLifecycleLayers);
  const Completion done = env_->wait_for("dup");
  EXPECT_EQ(done.status, CompletionStatus::kFinished) << done.message;
  EXPECT_EQ(env_->wrong_words(r), 0u);
}

TEST_P(Lifecycle, CancelBeforeMergeEndsTheRequestAtOnce) {
  auto r = blocks(4);
  ASSERT_TRUE(env_->submit_task("c1", r, 3 * kLifecycleBlockTokens, 0).ok());
  ASSERT_TRUE(env_->engine().cancel("c1", Deadline::after(5s)).ok());
  const Completion c = env_->wait_for("c1");
  EXPECT_EQ(c.status, CompletionStatus::kCancelled);
  ASSERT_TRUE(env_->submit_dest("c1", r).ok());  // the late partner is absorbed
  EXPECT_EQ(env_->engine().wait(Deadline::after(300ms)).code(), Errc::kTimeout)
      << "no second completion";
}

TEST_P(Lifecycle, CancelAfterMergeWithdrawsItFromEveryRank) {
  auto r = blocks(5);
  ASSERT_TRUE(env_->submit_task("c2", r, 3 * kLifecycleBlockTokens, 0).ok());
  ASSERT_TRUE(env_->submit_dest("c2", r).ok());
  ASSERT_TRUE(env_->engine().cancel("c2", Deadline::after(5s)).ok());
  const Completion c = env_->wait_for("c2");
  EXPECT_EQ(c.status, CompletionStatus::kCancelled) << c.message;
  // The slot is free again: a new request on it finishes.
  auto r2 = blocks(6);
  env_->fill(r2);
  ASSERT_TRUE(env_->submit_task("after-cancel", r2, 3 * kLifecycleBlockTokens, 0).ok());
  ASSERT_TRUE(env_->submit_dest("after-cancel", r2).ok());
  env_->prefill_step(1, {{0, 0, 3 * kLifecycleBlockTokens}}, kLifecycleLayers);
  EXPECT_EQ(env_->wait_for("after-cancel").status, CompletionStatus::kFinished);
  EXPECT_EQ(env_->wrong_words(r2), 0u);
}

TEST_P(Lifecycle, DeadlineExpiryTimesTheRequestOut) {
  auto r = blocks(7);
  ASSERT_TRUE(env_->submit_task("late", r, 3 * kLifecycleBlockTokens, 0, 300).ok());
  ASSERT_TRUE(env_->submit_dest("late", r).ok());
  const Completion c = env_->wait_for("late");  // no signals: prefill never happens
  EXPECT_EQ(c.status, CompletionStatus::kTimeout);
  std::string working = GetParam() == 1 ? "rank 0 was" : "ranks 0";
  for (uint32_t rank = 1; rank < GetParam(); ++rank)
    working += ", " + std::to_string(rank);
  if (GetParam() > 1) working += " were";
  EXPECT_EQ(c.message, "'late' passed its 300 ms deadline while " + working + " still working");
  EXPECT_GE(c.completed_ns - c.submitted_ns, 300'000'000u);
}

TEST_P(Lifecycle, CancelOfAnUnknownIdIsRejected) {
  ASSERT_TRUE(env_->engine().cancel("never-submitted", Deadline::after(5s)).ok());
  const Completion c = env_->wait_for("never-submitted");
  EXPECT_EQ(c.status, CompletionStatus::kRejected);
  EXPECT_EQ(c.message, "Cancel 'never-submitted': no live request has this id");
}

TEST_P(Lifecycle, ConnectTaskIsTheAndOfEveryRank) {
  ConnectSpec ok;
  ok.task_id = 11;
  ok.protocol = Protocol::kIpc;
  ok.peer_instance = env_->decode().name();
  ASSERT_TRUE(env_->engine().submit(ok, Deadline::after(5s)).ok());
  const Completion c = env_->wait_for("connect-11");
  EXPECT_EQ(c.status, CompletionStatus::kFinished) << c.message;

  ConnectSpec missing = ok;
  missing.task_id = 12;
  missing.peer_instance = "no-such-instance";
  ASSERT_TRUE(env_->engine().submit(missing, Deadline::after(5s)).ok());
  const Completion m = env_->wait_for("connect-12");
  EXPECT_EQ(m.status, CompletionStatus::kError);
  EXPECT_GE(m.error_rank, 0);
  EXPECT_NE(m.message.find("does not exist"), std::string::npos) << m.message;
}

INSTANTIATE_TEST_SUITE_P(Tp, Lifecycle, ::testing::Values(1u, 2u, 4u), name_of);

// Ctrl-C in a terminal (or `kill -INT -PGID`, or `timeout`) signals the
// coordinator's whole process group. Its workers lead groups of their own,
// so the signal reaches only the coordinator, which drains: a request in
// flight still finishes on the workers, and the instance stops cleanly.
// (With the workers in its group they exited at once, and the request
// failed as if its ranks had died.)
TEST(LifecycleProcesses, ASignalToTheCoordinatorsProcessGroupLetsARequestInFlightFinish) {
  InstanceArgs a;
  a.tp = 2;
  a.layers = kLifecycleLayers;
  a.block_size = kLifecycleBlockTokens;
  Placement where;
  where.prefill_prefix = {"/usr/bin/setsid"};  // the prefill coordinator leads a group of its own
  TwoInstances env("group-signal", a, where);
  const sim::RequestBlocks r{1, {5, 6, 7}, {20, 21, 22}};
  env.fill(r);
  ASSERT_TRUE(env.submit_task("req-g", r, 3 * kLifecycleBlockTokens, 0).ok());
  ASSERT_TRUE(env.submit_dest("req-g", r).ok());
  // Both halves on every rank (the bound task and the destination): the
  // request is live before the coordinator starts refusing submissions.
  const Deadline bound = Deadline::after(10s);
  while (worker_counter_sum(env.prefill().name(), "tasks") < 2 * a.tp && !bound.passed())
    std::this_thread::sleep_for(5ms);
  ASSERT_GE(worker_counter_sum(env.prefill().name(), "tasks"), 2u * a.tp);
  ASSERT_EQ(kill(-env.prefill().pid(), SIGINT), 0);
  env.prefill_step(1, {{0, 0, 3 * kLifecycleBlockTokens}}, kLifecycleLayers);
  const Completion c = env.wait_for("req-g");
  EXPECT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  EXPECT_EQ(env.wrong_words(r), 0u);
  env.stop_and_check_clean();  // the prefill coordinator's exit code: 0
}

TEST(LifecycleProcesses, SecondCoordinatorForTheSameInstanceIsRefusedWhileTheFirstLives) {
  InstanceArgs a;
  a.instance = unique_instance("twice");
  auto first = Instance::start(a);
  std::string out;
  const int code =
      run_program({Instance::bin("kvrelay-coordinator"), "--instance", a.instance}, &out);
  EXPECT_EQ(code, 3);
  EXPECT_NE(out.find("already served by coordinator pid " + std::to_string(first->pid())),
            std::string::npos)
      << out;
  EXPECT_EQ(first->stop(), 0);
  EXPECT_TRUE(first->leftover_segments().empty());
}

TEST(LifecycleProcesses, ExternalWorkersModeServesRequests) {
  InstanceArgs d;
  d.instance = unique_instance("ext-d");
  d.role = "decode";
  d.tp = 2;
  auto decode = Instance::start(d);
  InstanceArgs p = d;
  p.instance = unique_instance("ext-p");
  p.role = "prefill";
  p.external_workers = true;
  auto prefill = Instance::start(p);
  std::vector<pid_t> workers;
  for (uint32_t r = 0; r < 2; ++r)
    workers.push_back(spawn_program({Instance::bin("kvrelay-worker"), "--instance", p.instance,
                                     "--rank", std::to_string(r), "--log-level", "warn"}));
  auto client = Client::attach(p.instance, Deadline::after(30s));
  ASSERT_TRUE(client.ok()) << client.error().message;
  sim::RequestBlocks r{9, {1, 2}, {3, 4}};
  for (uint32_t rank = 0; rank < 2; ++rank)
    sim::fill_request(client->open_pool(rank, PoolTier::kDevice).value(), rank, r);
  CacheTaskSpec t{"ext", r.src, 2 * 16, 0, std::nullopt, 0};
  ASSERT_TRUE(client->submit(t, Deadline::after(5s)).ok());
  CacheDestSpec dst;
  dst.request_id = "ext";
  dst.dest_block_ids = r.dst;
  dst.peer_instance = d.instance;
  dst.device_ids = {0, 1};
  ASSERT_TRUE(client->submit(dst, Deadline::after(5s)).ok());
  for (uint32_t rank = 0; rank < 2; ++rank) {
    const BatchSlot b{0, 0, 32};
    ASSERT_TRUE(client->push_batch(rank, 1, std::span(&b, 1), Deadline::after(5s)).ok());
    for (uint32_t l = 0; l < 4; ++l)
      ASSERT_TRUE(client->push_layer_done(rank, 1, l, Deadline::after(5s)).ok());
  }
  auto c = client->wait(Deadline::after(20s));
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->status, CompletionStatus::kFinished) << c->message;
  uint64_t wrong = 0;
  for (uint32_t rank = 0; rank < 2; ++rank)
    wrong +=
        sim::check_request(decode->client().open_pool(rank, PoolTier::kDevice).value(), rank, r);
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(prefill->stop(), 0);
  for (pid_t w : workers) {
    auto e = wait_child(w, 10s);
    ASSERT_TRUE(e.has_value()) << "external worker did not exit after the instance shut down";
    EXPECT_TRUE(e->exited);
    EXPECT_EQ(e->code, 0);
  }
  EXPECT_EQ(decode->stop(), 0);
  EXPECT_TRUE(prefill->leftover_segments().empty());
}

}  // namespace
}  // namespace kvrelay::testing
