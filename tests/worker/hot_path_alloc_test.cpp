// The layer signal -> copy path allocates nothing once warm
// (docs/latency.md): a real prefill rank's data plane (its pool, the ipc transport,
// the scheduler) copies into a real decode rank's pool, and every operator
// new of this process is counted while the signals of steady-state requests
// are applied and their copies complete. Binding a request (its CacheTask and
// CacheDest) may allocate; its signals may not.
//
// A binary of its own: it replaces the global operator new
// (support/allocation_counter.cpp).
#include <capnp/message.h>
#include <gtest/gtest.h>

#include <optional>

#include "instance/control_segment.h"
#include "instance/pool_segment.h"
#include "support/allocation_counter.h"
#include "support/processes.h"
#include "worker/data_plane.h"

namespace kvrelay::worker {
namespace {

using records::LayerSignal;
using records::ReportKind;
using records::SignalKind;

using testing::AllocationWindow;

class HotPathAllocations : public ::testing::Test {
 protected:
  static constexpr uint32_t kLayers = 8;
  static constexpr uint32_t kBlocksPerRequest = 4;

  void SetUp() override {
    const std::string base = testing::current_test_instance();
    decode_config_ = config(base.substr(0, 50) + "d", Role::kDecode);
    prefill_config_ = config(base.substr(0, 50) + "p", Role::kPrefill);
    for (auto [cfg, control] : {std::pair{&decode_config_, &decode_control_},
                                std::pair{&prefill_config_, &prefill_control_}}) {
      Result<ControlSegment> c = ControlSegment::create(*cfg);
      ASSERT_TRUE(c) << c.error().message;
      *control = std::make_unique<ControlSegment>(std::move(c).value());
    }
    // The decode rank's data plane creates its pool, which the prefill side maps.
    Result<std::unique_ptr<DataPlane>> d =
        DataPlane::open(*decode_control_, 0, NetworkOptions{}, decode_doorbell_, {});
    ASSERT_TRUE(d) << d.error().message;
    decode_ = std::move(d).value();
    reports_.reserve(1024);
    DataPlane::Hooks hooks;
    hooks.report = [this](uint64_t h, ReportKind k, uint64_t, const std::string&, uint64_t) {
      reports_.push_back({h, k});
    };
    hooks.latency = [this](uint32_t, uint64_t, uint64_t, uint64_t bytes) { bytes_ += bytes; };
    hooks.hop = [this](WorkerHistogram, uint64_t) { ++hops_; };
    Result<std::unique_ptr<DataPlane>> p =
        DataPlane::open(*prefill_control_, 0, NetworkOptions{}, prefill_doorbell_, std::move(hooks));
    ASSERT_TRUE(p) << p.error().message;
    prefill_ = std::move(p).value();
  }

  void TearDown() override {
    prefill_.reset();
    decode_.reset();
    for (auto* control : {&prefill_control_, &decode_control_}) {
      if (!*control) continue;
      unlink_kvrelay_pools(**control);
      (void)(*control)->unlink();
    }
  }

  static InstanceConfig config(const std::string& name, Role role) {
    InstanceConfig c = default_config(name, 1);
    c.role = static_cast<uint32_t>(role);
    c.num_layers = kLayers;
    c.num_blocks = 64;
    c.block_size = 16;
    c.head_dim = 64;
    return c;
  }

  // Binds request `h` with both halves (allowed to allocate): to slot 0, or
  // in the original's legacy per-query mode to `legacy_step`.
  void bind(uint64_t h, std::optional<uint64_t> legacy_step = std::nullopt) {
    const uint32_t first = static_cast<uint32_t>((h % 8) * kBlocksPerRequest);
    capnp::MallocMessageBuilder m;
    auto t = m.initRoot<schema::CacheTask>();
    t.setRequestId("request-" + std::to_string(h));
    auto src = t.initSrcBlockIds(kBlocksPerRequest);
    for (uint32_t i = 0; i < kBlocksPerRequest; ++i)
      src.set(i, first + i);
    t.setNeedPrefillTokens(kBlocksPerRequest * 16);
    if (legacy_step)
      t.setLegacyPrefillStep(*legacy_step);
    else
      t.setEngineSlot(0);
    prefill_->scheduler().on_bind(h, t.asReader());
    capnp::MallocMessageBuilder md;
    auto d = md.initRoot<schema::CacheDest>();
    d.setRequestId("request-" + std::to_string(h));
    auto dst = d.initDestBlockIds(kBlocksPerRequest);
    for (uint32_t i = 0; i < kBlocksPerRequest; ++i)
      dst.set(i, 32 + first + i);
    d.setProtocol(schema::TransferProtocol::IPC);
    d.setPeerInstance(decode_config_.instance);
    d.initDeviceIds(1).set(0, 0);
    prefill_->scheduler().on_dest(h, d.asReader());
  }

  // The request's signals: its batch, then every layer, as an engine pushes
  // them; the copies are polled to completion as the worker's loop does.
  void signal_all_layers(uint64_t h, uint64_t step) {
    LayerSignal batch{};
    batch.kind = static_cast<uint32_t>(SignalKind::kBatch);
    batch.step = step;
    batch.count = 1;
    batch.entries[0] = records::BatchEntry{0, 0, kBlocksPerRequest * 16,
                                           records::request_tag("request-" + std::to_string(h))};
    prefill_->scheduler().on_signal(batch, index_++);
    signal_layers(SignalKind::kLayerDone, step);
  }

  // Every layer of `step` as signals of `kind` (kLayerDone after a batch;
  // kLegacyLayerDone in legacy per-query mode: the newest computed (step,
  // layer)), each layer's copies polled to completion.
  void signal_layers(SignalKind kind, uint64_t step) {
    SendScheduler& s = prefill_->scheduler();
    for (uint32_t l = 0; l < kLayers; ++l) {
      LayerSignal layer{};
      layer.kind = static_cast<uint32_t>(kind);
      layer.step = step;
      layer.layer = l;
      s.on_signal(layer, index_++);
      while (prefill_->transports().has_completions())
        s.poll_transfers();
    }
  }

  void expect_all_finished(size_t n) {
    ASSERT_EQ(reports_.size(), n);
    for (const Seen& r : reports_)
      ASSERT_EQ(r.kind, ReportKind::kFinished) << "request " << r.handle;
  }

  uint64_t block_bytes() const {
    return pool_geometry_of(prefill_config_, PoolTier::kDevice).block_bytes(PoolTensor::kKey);
  }

  struct Seen {
    uint64_t handle;
    ReportKind kind;
  };
  InstanceConfig decode_config_{}, prefill_config_{};
  std::unique_ptr<ControlSegment> decode_control_, prefill_control_;
  WaitEvent decode_doorbell_{}, prefill_doorbell_{};
  std::unique_ptr<DataPlane> decode_, prefill_;
  std::vector<Seen> reports_;
  uint64_t bytes_ = 0, hops_ = 0, index_ = 0;
};

TEST_F(HotPathAllocations, LayerSignalsAndTheirCopiesAllocateNothingOnceWarm) {
  uint64_t step = 0;
  for (uint64_t h = 1; h <= 16; ++h) {  // warm-up: first mappings, first growth of buffers
    bind(h);
    signal_all_layers(h, ++step);
  }
  expect_all_finished(16);
  const uint64_t bytes_before = bytes_;
  uint64_t allocations = 0;
  for (uint64_t h = 17; h <= 216; ++h) {
    bind(h);
    AllocationWindow window;
    signal_all_layers(h, ++step);
    allocations += window.count();
  }
  expect_all_finished(216);
  // The copies really ran: every layer's K and V of every block.
  EXPECT_EQ(bytes_ - bytes_before, 200u * kLayers * kBlocksPerRequest * 2 * block_bytes());
  EXPECT_EQ(allocations, 0u) << "allocations while applying 200 requests' signals (" << kLayers
                             << " layers each) and completing their copies";
}

TEST_F(HotPathAllocations, LegacyLayerSignalsAndTheirCopiesAllocateNothingOnceWarm) {
  // The original's per-query mode: a request is bound to the step its
  // prefill runs in, and every signal names the newest computed layer.
  uint64_t step = 0;
  for (uint64_t h = 1; h <= 16; ++h) {
    bind(h, ++step);
    signal_layers(SignalKind::kLegacyLayerDone, step);
  }
  expect_all_finished(16);
  const uint64_t bytes_before = bytes_;
  uint64_t allocations = 0;
  for (uint64_t h = 17; h <= 216; ++h) {
    bind(h, ++step);
    AllocationWindow window;
    signal_layers(SignalKind::kLegacyLayerDone, step);
    allocations += window.count();
  }
  expect_all_finished(216);
  EXPECT_EQ(bytes_ - bytes_before, 200u * kLayers * kBlocksPerRequest * 2 * block_bytes());
  EXPECT_EQ(allocations, 0u) << "allocations while applying 200 legacy requests' signals ("
                             << kLayers << " layers each) and completing their copies";
}

TEST_F(HotPathAllocations, TheCounterSeesAnAllocation) {
  // The check above can fail: an allocation inside a window is counted.
  AllocationWindow window;
  auto* p = new std::vector<int>(16);
  delete p;
  EXPECT_EQ(window.count(), 2u);
}

}  // namespace
}  // namespace kvrelay::worker
