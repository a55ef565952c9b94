// The swap engine's pipeline, against a copy engine whose tickets land only
// when the test says so (as a GPU's events do): a few layers of the op at
// the front are queued at once, each is published when it lands and in
// order, a cancel lets the queued layers land before it is reported, and a
// failed copy fails its op only once nothing of it is in flight.
#include "worker/swap_engine.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "instance/pool_segment.h"
#include "instance/swap_progress.h"
#include "support/processes.h"

namespace kvrelay::worker {
namespace {

using namespace std::chrono_literals;

// Copies at submit (so bytes are checkable) but says a ticket landed only
// once release() let it; wait() blocks until then.
class GatedCopyEngine final : public kernels::CopyEngine {
 public:
  const char* name() const override { return "gated"; }
  bool reaches(kernels::MemoryKind) const override { return true; }
  Result<kernels::CopyTicket> submit(std::span<const kernels::TensorCopy> batch) override {
    for (const kernels::TensorCopy& c : batch)
      kernels::copy_runs_host(c.src, c.dst, c.runs);
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
    return ++submitted_;
  }
  bool done(kernels::CopyTicket t) override {
    std::lock_guard<std::mutex> lock(mu_);
    return t <= released_;
  }
  Status wait(kernels::CopyTicket t) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return t <= released_; });
    if (t >= fail_from_) return make_error(Errc::kSystem, "the copy stream failed (injected)");
    return {};
  }
  Status failure() const override { return {}; }

  void release(uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    released_ += n;
    cv_.notify_all();
  }
  void fail_from(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_from_ = ticket;
  }
  // Waits (a little) for `n` tickets to have been submitted; how many were.
  uint64_t submitted_after(uint64_t n, std::chrono::milliseconds within = 2s) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, within, [&] { return submitted_ >= n; });
    // Anything beyond n would come at once: give it the chance to.
    lock.unlock();
    std::this_thread::sleep_for(20ms);
    lock.lock();
    return submitted_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t submitted_ = 0;
  uint64_t released_ = 0;
  uint64_t fail_from_ = UINT64_MAX;
};

class SwapPipelineTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kLayers = 10;

  void SetUp() override {
    PoolGeometry g;
    g.num_layers = kLayers;
    g.num_blocks = 8;
    g.kv_heads = 1;
    g.block_size = 4;
    g.head_dim = 8;
    const std::string base = testing::current_test_instance();
    Result<HostPool> device = HostPool::create(base + "-device", 0, PoolTier::kDevice, g);
    Result<HostPool> host = HostPool::create(base + "-host", 0, PoolTier::kHost, g);
    ASSERT_TRUE(device && host);
    device_ = std::make_unique<HostSegmentPool>(std::move(device).value());
    host_ = std::make_unique<HostSegmentPool>(std::move(host).value());
    auto engine = std::make_unique<GatedCopyEngine>();
    gate_ = engine.get();
    swap_ = std::make_unique<SwapEngine>(0, *device_, *host_, std::move(engine), progress_.get(),
                                         doorbell_);
  }
  void TearDown() override {
    gate_->release(1000);  // nothing left blocked behind the gate
    swap_.reset();
    (void)device_->segment().unlink();
    (void)host_->segment().unlink();
  }
  // Submits a load of every layer of blocks 0..3 (host) -> 4..7 (device).
  void load(uint64_t handle) {
    capnp::MallocMessageBuilder msg;
    auto t = msg.initRoot<schema::SwapTask>();
    t.setRequestId("load");
    t.setDirection(schema::SwapTask::Direction::LOAD);
    auto d = t.initDeviceBlockIds(4);
    auto h = t.initHostBlockIds(4);
    for (uint32_t i = 0; i < 4; ++i) {
      d.set(i, 4 + i);
      h.set(i, i);
    }
    slot_ = swap_progress::begin(*progress_, handle, 0x1234, 0, kLayers, generation_);
    swap_->submit(handle, t.asReader(), slot_, generation_);
  }
  uint32_t layers_done() {
    auto view = swap_progress::read(*progress_, slot_);
    return view ? swap_progress::layers_done(*progress_, *view, 0).value_or(0) : 0;
  }
  // Waits for the swap's one report.
  SwapReport report() {
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (!swap_->has_reports() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(1ms);
    std::vector<SwapReport> r = swap_->take_reports();
    EXPECT_EQ(r.size(), 1U);
    return r.empty() ? SwapReport{} : r.front();
  }
  void expect_no_report() {
    std::this_thread::sleep_for(30ms);
    EXPECT_FALSE(swap_->has_reports());
  }

  std::unique_ptr<HostSegmentPool> device_;
  std::unique_ptr<HostSegmentPool> host_;
  std::unique_ptr<SwapProgressTable> progress_ = std::make_unique<SwapProgressTable>();
  WaitEvent doorbell_{};
  GatedCopyEngine* gate_ = nullptr;
  std::unique_ptr<SwapEngine> swap_;
  uint32_t slot_ = 0;
  uint32_t generation_ = 0;
};

TEST_F(SwapPipelineTest, AFewLayersAreQueuedAtOnceAndEachIsPublishedWhenItLandsInOrder) {
  load(1);
  EXPECT_EQ(gate_->submitted_after(4), 4U) << "a window of 4 layers, not one, not all";
  EXPECT_EQ(layers_done(), 0U) << "nothing is published before it lands";
  gate_->release(1);
  EXPECT_EQ(gate_->submitted_after(5), 5U) << "the window moves by the layer that landed";
  EXPECT_EQ(layers_done(), 1U);
  gate_->release(2);
  EXPECT_EQ(gate_->submitted_after(7), 7U);
  EXPECT_EQ(layers_done(), 3U);
  expect_no_report();
  gate_->release(kLayers);
  const SwapReport r = report();
  EXPECT_EQ(r.kind, records::ReportKind::kFinished);
  EXPECT_EQ(layers_done(), kLayers);
  EXPECT_EQ(r.bytes, uint64_t{kLayers} * 2 * 4 * device_->geometry().block_bytes(PoolTensor::kKey));
}

TEST_F(SwapPipelineTest, ACancelStopsQueueingAndIsReportedOnlyOnceTheQueuedLayersLanded) {
  load(2);
  ASSERT_EQ(gate_->submitted_after(4), 4U);
  ASSERT_TRUE(swap_->cancel(2));
  expect_no_report();  // four layers still write into the device blocks
  gate_->release(3);
  expect_no_report();
  gate_->release(1);
  EXPECT_EQ(report().kind, records::ReportKind::kCancelled);
  EXPECT_EQ(gate_->submitted_after(5, 100ms), 4U) << "nothing was queued after the cancel";
}

TEST_F(SwapPipelineTest, AFailedCopyFailsTheOpOnceNothingOfItIsInFlight) {
  gate_->fail_from(2);
  load(3);
  ASSERT_EQ(gate_->submitted_after(4), 4U);
  gate_->release(1);
  ASSERT_EQ(gate_->submitted_after(5), 5U);
  EXPECT_EQ(layers_done(), 1U);
  gate_->release(1);  // ticket 2 fails; 3, 4 and 5 are still queued
  expect_no_report();
  gate_->release(3);
  const SwapReport r = report();
  EXPECT_EQ(r.kind, records::ReportKind::kFailed);
  EXPECT_EQ(r.message, "the copy stream failed (injected)");
  EXPECT_EQ(layers_done(), 1U) << "the failed layer and those after it are never published";
}

}  // namespace
}  // namespace kvrelay::worker
