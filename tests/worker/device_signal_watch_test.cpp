// GPU-written layer signals on the worker's side: layers come out as the
// word passes them, in order, never before; a stale word (a graph replayed
// without its step's base) releases nothing; a dead session's step stops
// holding the ring.
#include "worker/device_signal_watch.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvrelay::worker {
namespace {

using records::LayerSignal;
using records::SignalKind;

LayerSignal step_record(uint64_t step, uint32_t layers, uint64_t base, uint32_t session = 7) {
  LayerSignal r{};
  r.kind = static_cast<uint32_t>(SignalKind::kDeviceLayers);
  r.step = step;
  r.count = layers;
  r.device_base = base;
  r.session = session;
  return r;
}

class DeviceSignalWatchTest : public ::testing::Test {
 protected:
  std::vector<uint32_t> poll() {
    std::vector<uint32_t> layers;
    watch_.poll(
        [&](const LayerSignal& s) {
          EXPECT_EQ(s.kind, static_cast<uint32_t>(SignalKind::kLayerDone));
          EXPECT_EQ(s.step, step_);
          EXPECT_EQ(s.session, 7U);
          layers.push_back(s.layer);
        },
        ++now_);
    return layers;
  }
  std::atomic<uint64_t> word_{1000};
  DeviceSignalWatch watch_{word_};
  uint64_t step_ = 42;
  uint64_t now_ = 1;
};

TEST_F(DeviceSignalWatchTest, LayersComeOutInOrderAsTheWordPassesThemAndNeverBefore) {
  ASSERT_TRUE(watch_.follow(step_record(step_, 4, 1000), now_));
  EXPECT_TRUE(watch_.pending());
  EXPECT_TRUE(poll().empty()) << "the word is at the base: no layer is written yet";
  word_ = 1001;
  EXPECT_EQ(poll(), (std::vector<uint32_t>{0}));
  word_ = 1003;  // the worker looked late: two layers at once, in order
  EXPECT_EQ(poll(), (std::vector<uint32_t>{1, 2}));
  EXPECT_TRUE(watch_.pending());
  word_ = 1004;
  EXPECT_EQ(poll(), (std::vector<uint32_t>{3}));
  EXPECT_FALSE(watch_.pending());
  word_ = 1010;
  EXPECT_TRUE(poll().empty()) << "a step's layers come out once";
}

TEST_F(DeviceSignalWatchTest, AReplayWithoutItsStepBaseRepeatsOldCountsAndReleasesNothing) {
  ASSERT_TRUE(watch_.follow(step_record(step_, 3, 1000), now_));
  word_ = 1003;
  EXPECT_EQ(poll().size(), 3U);
  // The next step's base is 1003; a replay that forgot to write it signals
  // 1001..1003 again: not one of the new step's layers.
  step_ = 43;
  ASSERT_TRUE(watch_.follow(step_record(step_, 3, 1003), now_));
  for (uint64_t stale : {1001U, 1002U, 1003U}) {
    word_ = stale;
    EXPECT_TRUE(poll().empty()) << "word " << stale;
  }
  word_ = 1005;
  EXPECT_EQ(poll(), (std::vector<uint32_t>{0, 1}));
}

TEST_F(DeviceSignalWatchTest, ItSpinsOnlyWhileLayersKeepComing) {
  ASSERT_TRUE(watch_.follow(step_record(step_, 2, 1000), 0));
  EXPECT_TRUE(watch_.spinning(DeviceSignalWatch::kSpinAfterProgressNs - 1));
  EXPECT_FALSE(watch_.spinning(DeviceSignalWatch::kSpinAfterProgressNs))
      << "no progress for a while: nap instead of burning a core";
  word_ = 1001;
  now_ = DeviceSignalWatch::kSpinAfterProgressNs * 3;
  EXPECT_EQ(poll().size(), 1U);
  EXPECT_TRUE(watch_.spinning(now_ + 10));
}

TEST_F(DeviceSignalWatchTest, ADeadSessionsStepStopsHoldingTheRing) {
  ASSERT_TRUE(watch_.follow(step_record(step_, 4, 1000), now_));
  word_ = 1001;
  EXPECT_EQ(poll().size(), 1U);
  watch_.on_session_ended(8);
  EXPECT_TRUE(watch_.pending()) << "another session's end changes nothing";
  watch_.on_session_ended(7);
  EXPECT_FALSE(watch_.pending());
  word_ = 1004;
  EXPECT_TRUE(poll().empty());
}

TEST_F(DeviceSignalWatchTest, AStepOfImpossiblyManyLayersIsRefused) {
  EXPECT_FALSE(watch_.follow(step_record(step_, DeviceSignalWatch::kMaxLayers + 1, 1000), now_));
  EXPECT_FALSE(watch_.pending());
}

}  // namespace
}  // namespace kvrelay::worker
