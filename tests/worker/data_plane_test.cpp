// A rank's data plane, built over a real control segment of this process:
// it maps the rank's pools of the instance's geometry, and a RegisterPool
// either replaces a pool with the engine's own segment (and everything over
// it) or is refused leaving everything as it was.
#include "worker/data_plane.h"

#include <capnp/message.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "instance/fd_socket.h"
#include "instance/names.h"
#include "instance/pool_segment.h"
#include "schemas/pool_descriptor.h"
#include "support/memfd_pool.h"
#include "support/processes.h"

namespace kvrelay::worker {
namespace {

using namespace std::chrono_literals;

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
    configure(config_);
    Result<ControlSegment> c = ControlSegment::create(config_);
    ASSERT_TRUE(c) << c.error().message;
    control_ = std::make_unique<ControlSegment>(std::move(c).value());
    Result<std::unique_ptr<DataPlane>> d =
        DataPlane::open(*control_, 0, NetworkOptions{}, doorbell_, {});
    ASSERT_TRUE(d) << d.error().message;
    data_ = std::move(d).value();
  }
  // What a fixture changes in the instance's configuration before it starts.
  virtual void configure(InstanceConfig&) {}
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
  EXPECT_EQ(data_->device_pool()->geometry(), pool_geometry_of(config_, PoolTier::kDevice));
  ASSERT_NE(data_->host_pool(), nullptr);
  EXPECT_EQ(data_->host_pool()->geometry(), pool_geometry_of(config_, PoolTier::kHost));
  EXPECT_NE(data_->swap(), nullptr) << "a host tier has a swap engine";
  EXPECT_EQ(data_->truncated_pool(), nullptr);
  EXPECT_EQ(data_->scheduler().live_requests(), 0u);
}

TEST_F(DataPlaneTest, ARegisteredDevicePoolReplacesTheOldOneAndEverythingOverIt) {
  const std::string mine =
      engine_pool(pool_geometry_of(config_, PoolTier::kDevice), PoolTier::kDevice);
  const std::string ours = data_->device_pool()->name();
  const PoolRegistration r = register_pool(mine, PoolTier::kDevice);
  EXPECT_TRUE(r.registered) << r.message;
  EXPECT_FALSE(r.broken);
  EXPECT_EQ(data_->device_pool()->name(), mine);
  EXPECT_EQ(SharedSegment::open(ours, SegmentAccess::kReadOnly).code(), Errc::kNotFound)
      << "the pool the worker made is nobody's now: its name is gone";
  EXPECT_NE(data_->swap(), nullptr) << "the swap engine was rebuilt over the new pool";
  EXPECT_EQ(data_->scheduler().live_requests(), 0u);
}

TEST_F(DataPlaneTest, APoolOfAnotherGeometryIsRefusedAndNothingChanges) {
  const std::string before = data_->device_pool()->name();
  PoolGeometry wrong = pool_geometry_of(config_, PoolTier::kDevice);
  wrong.head_dim = 16;
  const PoolRegistration r =
      register_pool(engine_pool(wrong, PoolTier::kDevice), PoolTier::kDevice);
  EXPECT_FALSE(r.registered);
  EXPECT_FALSE(r.broken);
  EXPECT_NE(r.message.find("head_dim"), std::string::npos) << r.message;
  EXPECT_EQ(data_->device_pool()->name(), before);
}

// The engine's memory by tensor table. memfds stand in for GPU memory
// shared by fd (a CUDA VMM export is a POSIX fd too): they travel over the
// rank's real fd socket, are claimed by ticket, mapped, and offered to peers.
class TensorTablePoolTest : public DataPlaneTest {
 protected:
  // Describes `pool` as its engine would, under `ticket`.
  void describe(schema::PoolDescriptor::Builder d, const testing::MemfdPool& pool, uint64_t ticket,
                PoolTier tier = PoolTier::kDevice) {
    d.setLocation(schema::PoolDescriptor::Location::HOST_FD);
    d.setTier(tier == PoolTier::kHost ? schema::PoolDescriptor::Tier::HOST
                                      : schema::PoolDescriptor::Tier::DEVICE);
    messages::set_shape(d, pool.geometry());
    auto memories = d.initMemories(static_cast<uint32_t>(pool.memories()));
    for (uint32_t m = 0; m < pool.memories(); ++m) {
      memories[m].setFdIndex(m);
      memories[m].setBytes(pool.memory_bytes(m));
    }
    const uint32_t n = pool.geometry().total_layers() * pool.geometry().tensors_per_layer();
    auto tensors = d.initTensors(n);
    for (uint32_t t = 0; t < n; ++t) {
      tensors[t].setMemory(pool.memory_of(t));
      tensors[t].setOffset(pool.offset_of(t));
    }
    d.setFdTicket(ticket);
  }
  uint64_t pass(const testing::MemfdPool& pool) {
    const std::vector<int> fds = pool.fds();
    Result<uint64_t> ticket = pass_fds(config_.instance, 0, fds, Deadline::after(5s));
    EXPECT_TRUE(ticket) << ticket.error().message;
    return ticket ? *ticket : 0;
  }
  PoolRegistration register_table(const testing::MemfdPool& pool, uint64_t ticket) {
    capnp::MallocMessageBuilder msg;
    auto d = msg.initRoot<schema::PoolDescriptor>();
    describe(d, pool, ticket);
    return data_->register_pool(d.asReader());
  }
  // Every byte of every tensor of `local` is the engine's pattern.
  static void expect_pattern(const LocalPool& local) {
    const PoolGeometry& g = local.geometry();
    for (uint32_t t = 0; t < g.total_layers() * g.tensors_per_layer(); ++t) {
      const uint32_t layer = t / g.tensors_per_layer();
      const auto tensor = static_cast<PoolTensor>(t % g.tensors_per_layer());
      const std::byte* p = local.tensor(layer, tensor);
      ASSERT_NE(p, nullptr);
      for (uint64_t b = 0; b < g.tensor_bytes(layer, tensor); ++b)
        ASSERT_EQ(p[b], testing::MemfdPool::pattern(t, b)) << "tensor " << t << " byte " << b;
    }
  }
};

TEST_F(TensorTablePoolTest, MemfdsPassedByTicketBecomeTheDevicePoolTensorByTensor) {
  const testing::MemfdPool pool(pool_geometry_of(config_, PoolTier::kDevice), 2);  // a layer each
  const uint64_t ticket = pass(pool);
  const PoolRegistration r = register_table(pool, ticket);
  ASSERT_TRUE(r.registered) << r.message;
  expect_pattern(*data_->device_pool());
  EXPECT_EQ(data_->device_pool()->name(), fmt::format("host-fd:{:016x}", ticket));
  EXPECT_EQ(data_->fd_socket_server()->unclaimed(), 0U);
  // Writes through the worker's mapping are the engine's memory.
  *data_->device_pool()->tensor(1, PoolTensor::kValue) = std::byte{0x5a};
  EXPECT_EQ(*pool.tensor(3), std::byte{0x5a});
  Result<PublishedPool> published = find_published_pool(*control_, 0, PoolTier::kDevice);
  ASSERT_TRUE(published);
  EXPECT_EQ(published->location, PoolLocation::kHostFd);
  EXPECT_EQ(published->name, data_->device_pool()->name());
}

TEST_F(TensorTablePoolTest, APeerFetchesTheSamePoolFromTheRanksSocket) {
  const testing::MemfdPool pool(pool_geometry_of(config_, PoolTier::kDevice), 4);
  const uint64_t ticket = pass(pool);
  ASSERT_TRUE(register_table(pool, ticket).registered);
  Result<SharedPool> shared =
      fetch_shared_pool(config_.instance, 0, PoolTier::kDevice, Deadline::after(5s));
  ASSERT_TRUE(shared) << shared.error().message;
  EXPECT_EQ(shared->ticket, ticket);
  EXPECT_EQ(shared->fds.size(), pool.memories());
  // The peer's copies of the fds name the same memory.
  void* p = mmap(nullptr, pool.memory_bytes(0), PROT_READ, MAP_SHARED, shared->fds[0].get(), 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(std::memcmp(p, pool.tensor(0), pool.memory_bytes(0)), 0);
  munmap(p, pool.memory_bytes(0));
  EXPECT_EQ(fetch_shared_pool(config_.instance, 0, PoolTier::kHost, Deadline::after(5s)).code(),
            Errc::kNotFound)
      << "the host tier is the worker's own segment: nothing to fetch";
}

TEST_F(TensorTablePoolTest, MoreFdsThanOneMessageCarriesArriveUnderOneTicketInOrder) {
  std::vector<UniqueFd> files;
  std::vector<int> fds;
  for (int i = 0; i < 300; ++i) {  // a message carries 253
    files.emplace_back(memfd_create("kvrelay-test-many", MFD_CLOEXEC));
    fds.push_back(files.back().get());
  }
  Result<uint64_t> ticket = pass_fds(config_.instance, 0, fds, Deadline::after(5s));
  ASSERT_TRUE(ticket) << ticket.error().message;
  EXPECT_EQ(data_->fd_socket_server()->unclaimed(), 1U) << "one set, not two";
  Result<std::vector<UniqueFd>> claimed = data_->fd_socket_server()->claim(*ticket);
  ASSERT_TRUE(claimed) << claimed.error().message;
  ASSERT_EQ(claimed->size(), 300U);
  for (size_t i = 0; i < 300; ++i) {
    struct stat sent {
    }, got{};
    ASSERT_EQ(fstat(fds[i], &sent), 0);
    ASSERT_EQ(fstat((*claimed)[i].get(), &got), 0);
    EXPECT_EQ(sent.st_ino, got.st_ino) << "fd " << i << " is the same file, in the same place";
  }
}

TEST_F(TensorTablePoolTest, FdsAreClaimedOnceAndAnUnknownTicketIsRefused) {
  const testing::MemfdPool pool(pool_geometry_of(config_, PoolTier::kDevice), 2);
  const uint64_t ticket = pass(pool);
  ASSERT_TRUE(register_table(pool, ticket).registered);
  const std::string serving = data_->device_pool()->name();
  const PoolRegistration again = register_table(pool, ticket);
  EXPECT_FALSE(again.registered);
  EXPECT_NE(again.message.find("no file descriptors wait under ticket"), std::string::npos)
      << again.message;
  EXPECT_EQ(data_->device_pool()->name(), serving) << "a refusal changes nothing";
}

TEST_F(TensorTablePoolTest, AMemfdAnyoneCouldShrinkIsRefusedSayingHowToSealIt) {
  const testing::MemfdPool pool(pool_geometry_of(config_, PoolTier::kDevice), 2, /*seal=*/false);
  const std::string before = data_->device_pool()->name();
  const PoolRegistration r = register_table(pool, pass(pool));
  EXPECT_FALSE(r.registered);
  EXPECT_NE(r.message.find("F_SEAL_SHRINK"), std::string::npos) << r.message;
  EXPECT_EQ(data_->device_pool()->name(), before);
}

TEST_F(TensorTablePoolTest, AMemfdSmallerThanItsRegistrationSaysIsRefused) {
  const testing::MemfdPool pool(pool_geometry_of(config_, PoolTier::kDevice), 2);
  capnp::MallocMessageBuilder msg;
  auto d = msg.initRoot<schema::PoolDescriptor>();
  describe(d, pool, pass(pool));
  d.getMemories()[1].setBytes(pool.memory_bytes(1) * 2);
  const PoolRegistration r = data_->register_pool(d.asReader());
  EXPECT_FALSE(r.registered);
  EXPECT_NE(r.message.find("the memfd has"), std::string::npos) << r.message;
}

TEST_F(TensorTablePoolTest, WhenThePoolsOwnerExitsTheWorkerLetsGoOfItAndServesItsOwnAgain) {
  const testing::MemfdPool pool(pool_geometry_of(config_, PoolTier::kDevice), 2);
  const pid_t owner = fork();
  if (owner == 0) {
    pause();
    _exit(0);
  }
  capnp::MallocMessageBuilder msg;
  auto d = msg.initRoot<schema::PoolDescriptor>();
  describe(d, pool, pass(pool));
  d.setOwnerPid(static_cast<uint32_t>(owner));
  ASSERT_TRUE(data_->register_pool(d.asReader()).registered);
  const std::string engines = data_->device_pool()->name();
  EXPECT_FALSE(data_->release_orphaned_pools().broken);
  EXPECT_EQ(data_->device_pool()->name(), engines) << "its owner lives";

  kill(owner, SIGKILL);
  waitpid(owner, nullptr, 0);
  const PoolRegistration r = data_->release_orphaned_pools();
  EXPECT_FALSE(r.broken) << r.message;
  EXPECT_NE(data_->device_pool()->name(), engines);
  EXPECT_EQ(data_->device_pool()->memory_kind(), kernels::MemoryKind::kHost);
  Result<PublishedPool> published = find_published_pool(*control_, 0, PoolTier::kDevice);
  ASSERT_TRUE(published);
  EXPECT_EQ(published->location, PoolLocation::kHostSegment) << "peers follow the directory";
  EXPECT_EQ(fetch_shared_pool(config_.instance, 0, PoolTier::kDevice, Deadline::after(5s)).code(),
            Errc::kNotFound)
      << "nor is the dead engine's memory offered to peers";

  // An owner already gone at registration: refused, nothing changes.
  capnp::MallocMessageBuilder again;
  auto late = again.initRoot<schema::PoolDescriptor>();
  describe(late, pool, pass(pool));
  late.setOwnerPid(static_cast<uint32_t>(owner));
  const std::string serving = data_->device_pool()->name();
  const PoolRegistration refused = data_->register_pool(late.asReader());
  EXPECT_FALSE(refused.registered);
  EXPECT_NE(refused.message.find("has exited"), std::string::npos) << refused.message;
  EXPECT_EQ(data_->device_pool()->name(), serving);
}

// --pool none: the engine registers each rank's device pool (its GPU cache),
// so the worker makes none of its own, serves the engine's once registered,
// and goes back to none (not to a pool of its own) when its owner exits.
class PoolNoneTest : public TensorTablePoolTest {
 protected:
  void configure(InstanceConfig& c) override { c.engine_pools = 1; }
};

TEST_F(PoolNoneTest, TheWorkerMakesNoPoolServesTheEnginesAndGoesBackToNoneWhenItsOwnerExits) {
  EXPECT_FALSE(data_->serving());
  EXPECT_EQ(data_->device_pool(), nullptr);
  struct stat st {};
  EXPECT_NE(stat(("/dev/shm/" + pool_segment_name(config_.instance, "pool", 0)).c_str(), &st), 0)
      << "no device pool segment in /dev/shm";
  ASSERT_NE(data_->host_pool(), nullptr) << "the host swap tier is still the worker's";
  EXPECT_EQ(data_->swap(), nullptr) << "nothing to swap with yet";
  Result<PublishedPool> none = find_published_pool(*control_, 0, PoolTier::kDevice);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("--pool none"), std::string::npos) << none.error().message;
  EXPECT_NE(data_->no_pool_reason().find("--pool none"), std::string::npos);

  const testing::MemfdPool pool(pool_geometry_of(config_, PoolTier::kDevice), 2);
  const pid_t owner = fork();
  if (owner == 0) {
    pause();
    _exit(0);
  }
  capnp::MallocMessageBuilder msg;
  auto d = msg.initRoot<schema::PoolDescriptor>();
  describe(d, pool, pass(pool));
  d.setOwnerPid(static_cast<uint32_t>(owner));
  const PoolRegistration r = data_->register_pool(d.asReader());
  ASSERT_TRUE(r.registered) << r.message;
  ASSERT_TRUE(data_->serving());
  expect_pattern(*data_->device_pool());
  EXPECT_NE(data_->swap(), nullptr) << "the engine's pool swaps with the host tier";
  EXPECT_TRUE(find_published_pool(*control_, 0, PoolTier::kDevice));

  kill(owner, SIGKILL);
  waitpid(owner, nullptr, 0);
  const PoolRegistration after = data_->release_orphaned_pools();
  EXPECT_FALSE(after.broken) << after.message;
  EXPECT_FALSE(data_->serving()) << "nothing of its own to fall back on";
  EXPECT_EQ(data_->swap(), nullptr);
  EXPECT_FALSE(find_published_pool(*control_, 0, PoolTier::kDevice)) << "peers see it gone";
  EXPECT_NE(stat(("/dev/shm/" + pool_segment_name(config_.instance, "pool", 0)).c_str(), &st), 0);
  EXPECT_NE(data_->no_pool_reason().find(fmt::format("pid {}", owner)), std::string::npos)
      << data_->no_pool_reason();

  // The engine registers again, and the rank serves again.
  capnp::MallocMessageBuilder again;
  auto next = again.initRoot<schema::PoolDescriptor>();
  describe(next, pool, pass(pool));
  ASSERT_TRUE(data_->register_pool(next.asReader()).registered);
  EXPECT_TRUE(data_->serving());
}

TEST_F(TensorTablePoolTest, ARegisteredHostTierIsPinnedOnlyForAGpuAndSwapsOverMemcpy) {
  const testing::MemfdPool pool(pool_geometry_of(config_, PoolTier::kHost), 2);
  capnp::MallocMessageBuilder msg;
  auto d = msg.initRoot<schema::PoolDescriptor>();
  describe(d, pool, pass(pool), PoolTier::kHost);
  const PoolRegistration r = data_->register_pool(d.asReader());
  ASSERT_TRUE(r.registered) << r.message;
  ASSERT_NE(data_->host_pool(), nullptr);
  expect_pattern(*data_->host_pool());
  EXPECT_NE(data_->swap(), nullptr);
}

TEST_F(DataPlaneTest, ACudaPoolWithoutAUsableGpuIsRefusedWithTheReason) {
  capnp::MallocMessageBuilder msg;
  auto d = msg.initRoot<schema::PoolDescriptor>();
  d.setLocation(schema::PoolDescriptor::Location::CUDA_IPC);
  const PoolGeometry g = pool_geometry_of(config_, PoolTier::kDevice);
  messages::set_shape(d, g);
  auto memories = d.initMemories(1);
  memories[0].setIpcHandle(kj::heapArray<kj::byte>(64));
  memories[0].setBytes(1 << 20);
  auto tensors = d.initTensors(g.total_layers() * 2);
  for (uint32_t t = 0; t < tensors.size(); ++t)
    tensors[t].setOffset(t * g.tensor_bytes(0, PoolTensor::kKey));
  const std::string before = data_->device_pool()->name();
  const PoolRegistration r = data_->register_pool(d.asReader());
  EXPECT_FALSE(r.registered);
  // No GPU here: "CUDA is not usable on this machine" (or, in a build
  // without CUDA, that it was built without); with a GPU, this zeroed handle
  // is refused by cudaIpcOpenMemHandle.
  EXPECT_EQ(r.message.rfind("cuda-ipc pool, memories[0] (1048576 bytes): ", 0), 0U) << r.message;
  EXPECT_EQ(data_->device_pool()->name(), before);
}

}  // namespace
}  // namespace kvrelay::worker
