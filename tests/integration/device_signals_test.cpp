// GPU-written layer signals on the worker's side, through real processes.
// The test stands in for the engine's GPU: it pushes a step's batch and its
// kDeviceLayers record on the rank's signal ring (as push_device_step does),
// then raises the rank's device signal word in the control segment layer by
// layer (as signal_layer's kernel does). Each layer moves once the word
// passes it and not before, the request finishes with the last, every byte
// lands, and a step replayed without its base moves nothing.
#include <gtest/gtest.h>

#include <thread>

#include "instance/control_segment.h"
#include "integration/request_driver.h"
#include "schemas/records.h"
#include "shm/spsc_ring.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;
using records::LayerSignal;
using records::SignalKind;

// The engine side of one rank's GPU signals, done by hand.
class FakeGpuRank {
 public:
  FakeGpuRank(const ControlSegment& control, uint32_t rank)
      : control_(control),
        rank_(rank),
        producer_(control.signal_ring<LayerSignal>(rank)->lease_producer().value()),
        word_(control.status().device_signals[rank].layers) {}

  // push_device_step: the batch, and the step whose `layers` layers the
  // word signals from its value now.
  uint64_t announce(uint64_t step, const BatchSlot& slot, uint32_t layers) {
    LayerSignal batch{};
    batch.kind = static_cast<uint32_t>(SignalKind::kBatch);
    batch.step = step;
    batch.count = 1;
    batch.entries[0] =
        records::BatchEntry{slot.slot, slot.chunk_token_offset, slot.chunk_len, slot.request_tag};
    push(batch);
    const uint64_t base = next_base_;
    LayerSignal device{};
    device.kind = static_cast<uint32_t>(SignalKind::kDeviceLayers);
    device.step = step;
    device.count = layers;
    device.device_base = base;
    push(device);
    next_base_ += layers;
    return base;
  }
  // signal_layer's kernel: the word, written without a system call.
  void write(uint64_t value) { word_.store(value, std::memory_order_release); }
  uint64_t word() const { return word_.load(); }

 private:
  void push(const LayerSignal& s) {
    ASSERT_TRUE(producer_.try_push(s));
    notify_waiters(control_.status().worker_doorbell[rank_]);
  }
  const ControlSegment& control_;
  uint32_t rank_;
  SpscProducer<LayerSignal> producer_;
  std::atomic<uint64_t>& word_;
  uint64_t next_base_ = word_.load();
};

TEST(DeviceSignals, EachLayerMovesOnceTheGpuWordPassesItAndTheRequestEndsWithTheLast) {
  TwoInstances env("devsig", RequestDriver::small_pair());
  RequestDriver driver(env, RequestDriver::kLayers, RequestDriver::kBlockTokens);
  Result<ControlSegment> control = ControlSegment::attach(env.prefill().name());
  ASSERT_TRUE(control) << control.error().message;
  std::vector<std::unique_ptr<FakeGpuRank>> gpu;
  for (uint32_t rank = 0; rank < env.tp(); ++rank)
    gpu.push_back(std::make_unique<FakeGpuRank>(*control, rank));

  const sim::RequestBlocks r = driver.blocks(4);
  const uint32_t tokens = 4 * RequestDriver::kBlockTokens;
  ASSERT_TRUE(env.submit_task("gpu-signalled", r, tokens, 0));
  ASSERT_TRUE(env.submit_dest("gpu-signalled", r));
  const BatchSlot slot{0, 0, tokens, Client::request_tag("gpu-signalled")};
  std::vector<uint64_t> base;
  for (auto& g : gpu)
    base.push_back(g->announce(1, slot, RequestDriver::kLayers));

  // Nothing is written: nothing moves.
  std::this_thread::sleep_for(100ms);
  for (uint32_t rank = 0; rank < env.tp(); ++rank)
    EXPECT_TRUE(sim::block_is_poisoned(env.dst_pool(rank), 0, 0, r.dst[0])) << "rank " << rank;
  // Layers 0..2 written on every rank: they move, layer 3 does not.
  for (uint32_t rank = 0; rank < env.tp(); ++rank)
    gpu[rank]->write(base[rank] + 3);
  const auto moved = [&](uint32_t layer) {
    for (uint32_t rank = 0; rank < env.tp(); ++rank)
      if (sim::block_is_poisoned(env.dst_pool(rank), layer, 0, r.dst.back())) return false;
    return true;
  };
  for (int i = 0; i < 200 && !moved(2); ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(moved(0) && moved(1) && moved(2)) << "layers the GPU signalled are sent at once";
  EXPECT_FALSE(moved(3)) << "a layer the GPU has not signalled is never sent";
  EXPECT_EQ(env.engine().wait(Deadline::after(100ms)).code(), Errc::kTimeout)
      << "the request is not finished before its last layer";

  for (uint32_t rank = 0; rank < env.tp(); ++rank)
    gpu[rank]->write(base[rank] + 4);
  const Completion c = env.wait_for("gpu-signalled");
  EXPECT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  EXPECT_EQ(env.wrong_words(r), 0U);

  // The next step's graph replays without its base written: the word
  // repeats last step's counts, and the new request waits for real ones.
  const sim::RequestBlocks next = driver.blocks(2);
  const uint32_t next_tokens = 2 * RequestDriver::kBlockTokens;
  ASSERT_TRUE(env.submit_task("after-a-stale-replay", next, next_tokens, 1));
  ASSERT_TRUE(env.submit_dest("after-a-stale-replay", next));
  const BatchSlot next_slot{1, 0, next_tokens, Client::request_tag("after-a-stale-replay")};
  for (uint32_t rank = 0; rank < env.tp(); ++rank) {
    base[rank] = gpu[rank]->announce(2, next_slot, RequestDriver::kLayers);
    for (uint64_t stale = base[rank] - 3; stale <= base[rank]; ++stale)
      gpu[rank]->write(stale);
  }
  EXPECT_EQ(env.engine().wait(Deadline::after(200ms)).code(), Errc::kTimeout);
  for (uint32_t rank = 0; rank < env.tp(); ++rank)
    EXPECT_TRUE(sim::block_is_poisoned(env.dst_pool(rank), 0, 0, next.dst[0])) << "rank " << rank;
  for (uint32_t rank = 0; rank < env.tp(); ++rank)
    gpu[rank]->write(base[rank] + 4);
  const Completion done = env.wait_for("after-a-stale-replay");
  EXPECT_EQ(done.status, CompletionStatus::kFinished) << done.message;
  EXPECT_EQ(env.wrong_words(next), 0U);
  gpu.clear();
  env.stop_and_check_clean();
}

}  // namespace
}  // namespace kvrelay::testing
