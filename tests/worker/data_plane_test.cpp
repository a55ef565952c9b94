// A rank's data plane, built over a real control segment of this process:
// it maps the rank's pools of the instance's geometry, and a RegisterPool
// either replaces a pool with the engine's own segment (and everything over
// it) or is refused leaving everything as it was.
#include "worker/data_plane.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include "instance/names.h"
#include "instance/pool_segment.h"
#include "support/processes.h"

namespace kvrelay::worker {
namespace {

class DataPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name = testing::current_test_instance();
    config_ = default_config(name, 1);
    config_.num_layers = 2;
    config_.num_blocks = 16;
    config_.block_size = 4;
    config_.head_dim = 8;
    config_.host_blocks = 8;
    Result<ControlSegment> c = ControlSegment::create(config_);
    ASSERT_TRUE(c) << c.error().message;
    control_ = std::make_unique<ControlSegment>(std::move(c).value());
    Result<std::unique_ptr<DataPlane>> d =
        DataPlane::open(*control_, 0, NetworkOptions{}, doorbell_, {});
    ASSERT_TRUE(d) << d.error().message;
    data_ = std::move(d).value();
  }
  void TearDown() override {
    data_.reset();
    for (const std::string& s : engine_segments_)
      (void)SharedSegment::unlink(s);
    if (control_) {
      unlink_kvrelay_pools(*control_);
      (void)control_->unlink();
    }
  }

  // A pool segment the engine made itself, of `geometry`.
  std::string engine_pool(const PoolGeometry& geometry, PoolTier tier) {
    const std::string name = pool_segment_name(config_.instance, "engine", next_++);
    Result<HostPool> p = HostPool::create(name, 0, tier, geometry);
    EXPECT_TRUE(p) << p.error().message;
    engine_segments_.push_back(name);
    engine_pools_.push_back(std::make_unique<HostPool>(std::move(p).value()));
    return name;
  }
  PoolRegistration register_pool(const std::string& segment, PoolTier tier) {
    capnp::MallocMessageBuilder msg;
    auto d = msg.initRoot<schema::PoolDescriptor>();
    d.setLocation(schema::PoolDescriptor::Location::HOST_SEGMENT);
    d.setTier(tier == PoolTier::kHost ? schema::PoolDescriptor::Tier::HOST
                                      : schema::PoolDescriptor::Tier::DEVICE);
    d.setSegmentName(segment);
    return data_->register_pool(d.asReader());
  }

  InstanceConfig config_{};
  std::unique_ptr<ControlSegment> control_;
  WaitEvent doorbell_{};
  std::unique_ptr<DataPlane> data_;
  std::vector<std::string> engine_segments_;
  std::vector<std::unique_ptr<HostPool>> engine_pools_;
  uint32_t next_ = 0;
};

TEST_F(DataPlaneTest, ItMapsTheRanksPoolsOfTheInstancesGeometryAndSwapsBetweenThem) {
  EXPECT_EQ(data_->device_pool().geometry(), pool_geometry_of(config_, PoolTier::kDevice));
  ASSERT_NE(data_->host_pool(), nullptr);
  EXPECT_EQ(data_->host_pool()->geometry(), pool_geometry_of(config_, PoolTier::kHost));
  EXPECT_NE(data_->swap(), nullptr) << "a host tier has a swap engine";
  EXPECT_EQ(data_->truncated_pool(), nullptr);
  EXPECT_EQ(data_->scheduler().live_requests(), 0u);
}

TEST_F(DataPlaneTest, ARegisteredDevicePoolReplacesTheOldOneAndEverythingOverIt) {
  const std::string mine =
      engine_pool(pool_geometry_of(config_, PoolTier::kDevice), PoolTier::kDevice);
  const std::string ours = data_->device_pool().name();
  const PoolRegistration r = register_pool(mine, PoolTier::kDevice);
  EXPECT_TRUE(r.registered) << r.message;
  EXPECT_FALSE(r.broken);
  EXPECT_EQ(data_->device_pool().name(), mine);
  EXPECT_EQ(SharedSegment::open(ours, SegmentAccess::kReadOnly).code(), Errc::kNotFound)
      << "the pool the worker made is nobody's now: its name is gone";
  EXPECT_NE(data_->swap(), nullptr) << "the swap engine was rebuilt over the new pool";
  EXPECT_EQ(data_->scheduler().live_requests(), 0u);
}

TEST_F(DataPlaneTest, APoolOfAnotherGeometryIsRefusedAndNothingChanges) {
  const std::string before = data_->device_pool().name();
  PoolGeometry wrong = pool_geometry_of(config_, PoolTier::kDevice);
  wrong.head_dim = 16;
  const PoolRegistration r =
      register_pool(engine_pool(wrong, PoolTier::kDevice), PoolTier::kDevice);
  EXPECT_FALSE(r.registered);
  EXPECT_FALSE(r.broken);
  EXPECT_NE(r.message.find("head_dim"), std::string::npos) << r.message;
  EXPECT_EQ(data_->device_pool().name(), before);
}

TEST_F(DataPlaneTest, ACudaPoolIsRefusedWithTheReason) {
  capnp::MallocMessageBuilder msg;
  auto d = msg.initRoot<schema::PoolDescriptor>();
  d.setLocation(schema::PoolDescriptor::Location::CUDA_IPC);
  const PoolRegistration r = data_->register_pool(d.asReader());
  EXPECT_FALSE(r.registered);
  EXPECT_EQ(r.message, "CUDA IPC pools need a CUDA build and a GPU");
}

}  // namespace
}  // namespace kvrelay::worker
