// Swap between the device tier and the host tier across real processes
//: evict, then load layer by layer while a simulated forward pass
// waits on each layer in turn; swaps concurrent with prefill->decode sends; a
// load cancelled midway; bad tasks.
#include <gtest/gtest.h>
#include <signal.h>

#include "instance/control_segment.h"
#include "integration/two_instances.h"
#include "schemas/codec.h"
#include "schemas/message_ring.h"
#include "shm/liveness.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kSwapLayers = 4;

class Swap : public ::testing::Test {
 protected:
  void SetUp() override {
    InstanceArgs a;
    a.tp = 2;
    a.layers = kSwapLayers;
    a.blocks = 64;
    a.host_blocks = 128;
    a.head_dim = 32;
    env_ = std::make_unique<TwoInstances>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), a);
    for (uint32_t r = 0; r < 2; ++r)
      host_.push_back(std::make_unique<PoolView>(
          std::move(env_->engine().open_pool(r, PoolTier::kHost)).value()));
  }
  void TearDown() override {
    host_.clear();
    if (env_) env_->stop_and_check_clean();
  }
  Client& engine() { return env_->engine(); }
  const PoolView& device(uint32_t rank) { return env_->src_pool(rank); }

  void fill_device(uint64_t tag, const std::vector<uint32_t>& blocks) {
    for (uint32_t rank = 0; rank < 2; ++rank)
      sim::fill_request(device(rank), rank, sim::RequestBlocks{tag, blocks, {}});
  }
  void poison_device(const std::vector<uint32_t>& blocks) {
    for (uint32_t rank = 0; rank < 2; ++rank)
      for (uint32_t l = 0; l < kSwapLayers; ++l)
        for (uint32_t t = 0; t < 2; ++t)
          for (uint32_t b : blocks)
            sim::poison_block(device(rank), l, t, b);
  }
  // Wrong words in layer `layer` of `blocks` of `pool` against request `tag`'s pattern.
  uint64_t wrong(const PoolView& pool, uint32_t rank, uint64_t tag,
                 const std::vector<uint32_t>& blocks, uint32_t layer) {
    uint64_t w = 0;
    for (uint32_t t = 0; t < 2; ++t)
      for (uint32_t i = 0; i < blocks.size(); ++i)
        w += sim::check_block(pool, blocks[i], sim::BlockTag{tag, layer, t, i, rank});
    return w;
  }
  Status swap(const std::string& id, bool load, std::vector<uint32_t> dev,
              std::vector<uint32_t> host) {
    SwapSpec s;
    s.request_id = id;
    s.load = load;
    s.device_block_ids = std::move(dev);
    s.host_block_ids = std::move(host);
    return engine().submit(s, Deadline::after(5s));
  }
  std::unique_ptr<TwoInstances> env_;
  std::vector<std::unique_ptr<PoolView>> host_;
};

TEST_F(Swap, EvictThenLoadLayerByLayerRestoresEveryByteWhileTheForwardWaitsOnEachLayer) {
  const std::vector<uint32_t> dev = {3, 4, 5, 9, 20};
  const std::vector<uint32_t> host = {100, 101, 102, 50, 7};
  fill_device(1, dev);
  ASSERT_TRUE(swap("evict-1", false, dev, host).ok());
  const Completion e = env_->wait_for("evict-1");
  ASSERT_EQ(e.status, CompletionStatus::kFinished) << e.message;
  for (uint32_t rank = 0; rank < 2; ++rank)
    for (uint32_t l = 0; l < kSwapLayers; ++l)
      EXPECT_EQ(wrong(*host_[rank], rank, 1, host, l), 0u) << "host copy";

  poison_device(dev);  // the device blocks are reused meanwhile
  ASSERT_TRUE(swap("load-1", true, dev, host).ok());
  for (uint32_t l = 0; l < kSwapLayers; ++l) {
    Status s = engine().wait_layer("load-1", l, Deadline::after(10s));
    ASSERT_TRUE(s.ok()) << s.error().message;
    for (uint32_t rank = 0; rank < 2; ++rank)
      EXPECT_EQ(wrong(device(rank), rank, 1, dev, l), 0u)
          << "layer " << l << " rank " << rank << " was ready";
  }
  const Completion c = env_->wait_for("load-1");
  EXPECT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  EXPECT_EQ(c.bytes_moved,
            2u * kSwapLayers * 2 * dev.size() * device(0).geometry().block_bytes(PoolTensor::kKey));
  EXPECT_GE(c.first_copy_ns, c.submitted_ns);
  EXPECT_LE(c.first_copy_ns, c.completed_ns);
  // After completion, waits on any layer return at once; one rank can be named.
  EXPECT_TRUE(engine().wait_layer("load-1", kSwapLayers - 1, Deadline::now(), 1).ok());
  EXPECT_EQ(engine().wait_layer("load-1", kSwapLayers, Deadline::now()).code(), Errc::kInvalidArgument);
}

TEST_F(Swap, SwapsAndPrefillToDecodeSendsRunSideBySide) {
  const std::vector<uint32_t> dev = {30, 31, 32, 33};
  const std::vector<uint32_t> host = {60, 61, 62, 63};
  fill_device(2, dev);
  sim::RequestBlocks pd{3, {1, 2}, {1, 2}};
  env_->fill(pd);
  ASSERT_TRUE(env_->submit_task("pd", pd, 32, 0).ok());
  ASSERT_TRUE(env_->submit_dest("pd", pd).ok());
  ASSERT_TRUE(swap("evict-2", false, dev, host).ok());
  env_->prefill_step(1, {{0, 0, 32, Client::request_tag("pd")}}, kSwapLayers);
  EXPECT_EQ(env_->wait_for("pd").status, CompletionStatus::kFinished);
  EXPECT_EQ(env_->wait_for("evict-2").status, CompletionStatus::kFinished);
  EXPECT_EQ(env_->wrong_words(pd), 0u);
  poison_device(dev);
  ASSERT_TRUE(swap("load-2", true, dev, host).ok());
  sim::RequestBlocks pd2{4, {5, 6}, {5, 6}};
  env_->fill(pd2);
  ASSERT_TRUE(env_->submit_task("pd2", pd2, 32, 1).ok());
  ASSERT_TRUE(env_->submit_dest("pd2", pd2).ok());
  env_->prefill_step(2, {{1, 0, 32, Client::request_tag("pd2")}}, kSwapLayers);
  EXPECT_EQ(env_->wait_for("load-2").status, CompletionStatus::kFinished);
  EXPECT_EQ(env_->wait_for("pd2").status, CompletionStatus::kFinished);
  EXPECT_EQ(env_->wrong_words(pd2), 0u);
  for (uint32_t rank = 0; rank < 2; ++rank)
    for (uint32_t l = 0; l < kSwapLayers; ++l)
      EXPECT_EQ(wrong(device(rank), rank, 2, dev, l), 0u);
}

TEST_F(Swap, LoadCancelledMidwayEndsOnceAndItsLaterLayersAreNotAwaited) {
  const std::vector<uint32_t> dev = {10, 11};
  const std::vector<uint32_t> host = {10, 11};
  // Freeze both workers so that the load and its cancel are both queued.
  std::vector<uint32_t> pids;
  {
    auto c = ControlSegment::attach(env_->prefill().name(),
                                    AttachOptions{.access = SegmentAccess::kReadOnly});
    ASSERT_TRUE(c.ok());
    for (uint32_t r = 0; r < 2; ++r)
      pids.push_back(read_slot(c->worker_slot(r)).owner.pid);
  }
  for (uint32_t pid : pids)
    kill(static_cast<pid_t>(pid), SIGSTOP);
  ASSERT_TRUE(swap("load-cancel", true, dev, host).ok());
  ASSERT_TRUE(engine().cancel("load-cancel", Deadline::after(5s)).ok());
  std::this_thread::sleep_for(100ms);  // both reach the task rings
  for (uint32_t pid : pids)
    kill(static_cast<pid_t>(pid), SIGCONT);
  const Completion c = env_->wait_for("load-cancel");
  EXPECT_TRUE(c.status == CompletionStatus::kCancelled || c.status == CompletionStatus::kFinished)
      << completion_status_name(c.status) << ": " << c.message;
  if (c.status == CompletionStatus::kCancelled) {
    const Status s = engine().wait_layer("load-cancel", kSwapLayers - 1, Deadline::after(5s));
    EXPECT_TRUE(s.ok() || s.code() == Errc::kAborted) << s.error().message;
  }
  EXPECT_EQ(engine().wait(Deadline::after(200ms)).code(), Errc::kTimeout)
      << "exactly one completion";
  // The engine keeps working.
  ASSERT_TRUE(swap("after-cancel", false, {12}, {12}).ok());
  EXPECT_EQ(env_->wait_for("after-cancel").status, CompletionStatus::kFinished);
}

TEST_F(Swap, BadTasksGetOneErrorEachAndNothingElseIsAffected) {
  struct Bad {
    std::vector<uint32_t> dev, host;
    const char* want;
  };
  const Bad bad[] = {
      {{1, 2}, {1}, "device_block_ids has 2 entries but host_block_ids has 1"},
      {{1}, {500}, "host_block_ids[0] = 500 is out of range: the host pool has 128 blocks"},
      {{1, 1}, {2, 3}, "device_block_ids has block 1 twice"},
  };
  int i = 0;
  for (const Bad& b : bad) {
    SwapSpec s;
    s.request_id = "bad-" + std::to_string(i++);
    s.device_block_ids = b.dev;
    s.host_block_ids = b.host;
    Status st = engine().submit(s, Deadline::after(5s));
    ASSERT_FALSE(st.ok()) << "the client refuses it before anything is written";
    EXPECT_NE(st.error().message.find(b.want), std::string::npos) << st.error().message;
  }
  // The same task written straight into the submit ring (an engine that does
  // not use the client library) gets an error completion.
  {
    auto control = ControlSegment::attach(env_->prefill().name());
    ASSERT_TRUE(control.ok());
    MpscProducer ring = control->submit_ring()->lease_producer().value();
    capnp::MallocMessageBuilder m;
    auto t = m.initRoot<schema::SwapTask>();
    t.setRequestId("raw-bad");
    t.initDeviceBlockIds(2).set(0, 1);
    t.initHostBlockIds(1).set(0, 1);
    ASSERT_TRUE(
        messages::write_message(ring, schema::MessageType::SWAP_TASK, m, Deadline::after(5s)).ok());
  }
  const Completion raw = env_->wait_for("raw-bad");
  EXPECT_EQ(raw.status, CompletionStatus::kError);
  EXPECT_NE(raw.message.find("device_block_ids has 2 entries but host_block_ids has 1"),
            std::string::npos)
      << raw.message;
  ASSERT_TRUE(swap("good", false, {1}, {1}).ok());
  EXPECT_EQ(env_->wait_for("good").status, CompletionStatus::kFinished);
  EXPECT_EQ(engine().wait(Deadline::after(200ms)).code(), Errc::kTimeout);
}

TEST(SwapProcesses, InstanceWithoutAHostTierRefusesSwapTasks) {
  InstanceArgs a;
  a.instance = unique_instance("no-host-tier");
  auto inst = Instance::start(a);
  SwapSpec s;
  s.request_id = "x";
  s.device_block_ids = {1};
  s.host_block_ids = {1};
  Status st = inst->client().submit(s, Deadline::after(5s));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("this instance has no host tier"), std::string::npos);
  EXPECT_EQ(inst->stop(), 0);
}

}  // namespace
}  // namespace kvrelay::testing
