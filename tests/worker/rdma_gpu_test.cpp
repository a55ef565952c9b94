// The rdma transport on pools in GPU memory, without a GPU or a NIC: the
// pools are FakeDevicePools (support/fake_device.h), whose addresses the CPU
// cannot touch, registered through their stand-in dma-bufs on the fake
// fabric, which writes into the dma-buf's pages as a NIC would. What
// arrives byte for byte, how a pool is split into registrations at its
// allocations' ends, and what a pool that can be registered neither way
// says.
#include <gtest/gtest.h>

#include "fake_fabric.h"
#include "support/fake_device.h"
#include "support/pool_patterns.h"
#include "worker/rdma/rdma_transport.h"
#include "worker/rdma/registered_pool.h"
#include "worker/receiver.h"

namespace kvrelay::worker::rdma {
namespace {

using namespace std::chrono_literals;
using kvrelay::testing::FakeDevicePool;
using testing::FakeFabric;

const PoolGeometry kGpuRdmaGeometry = kvrelay::testing::transport_geometry();
const uint64_t kGpuRdmaTensor = kGpuRdmaGeometry.tensor_bytes(0, PoolTensor::kKey);  // 128 KiB

TEST(RdmaGpuPool, ABetweenGpuPoolsTransferLandsByteForByteThroughDmabufs) {
  FakeFabric fabric;
  FakeDevicePool src(kGpuRdmaGeometry, "src"), dst(kGpuRdmaGeometry, "dst");
  kvrelay::testing::fill(src.mirror());
  Result<std::unique_ptr<RegisteredPool>> src_reg =
      RegisteredPool::create(fabric, src.pool(), src.device()->dmabuf_exporter());
  Result<std::unique_ptr<RegisteredPool>> dst_reg =
      RegisteredPool::create(fabric, dst.pool(), dst.device()->dmabuf_exporter());
  ASSERT_TRUE(src_reg && dst_reg);
  EXPECT_EQ((*src_reg)->registrations(), 1u) << "one allocation, one dma-buf";
  EXPECT_EQ((*src_reg)->dmabuf_registrations(), 1u);

  const AuthKey key = AuthKey::from_bytes(std::vector<uint8_t>(32, 7));
  net::NetThread net;
  ReceiverOptions ro;
  ro.instance = "d";
  ro.rdma = std::make_shared<RdmaListener>(
      &fabric, "", dst.pool(), 0, std::shared_ptr<const RegisteredPool>(std::move(*dst_reg)));
  Result<std::unique_ptr<Receiver>> receiver = Receiver::start(net, dst.pool(), key, ro);
  ASSERT_TRUE(receiver) << receiver.error().message;
  RdmaSenderOptions so;
  so.instance = "p";
  so.queue_pairs = 2;
  RdmaTransport sender(net, src.pool(), &key, &fabric, "", so, nullptr,
                       std::shared_ptr<const RegisteredPool>(std::move(*src_reg)));
  capnp::MallocMessageBuilder m;
  auto d = m.initRoot<schema::CacheDest>();
  d.setProtocol(schema::TransferProtocol::RDMA);
  d.setPeerAddress("127.0.0.1");
  d.setPeerInstance("d");
  d.initRdmaPorts(1).set(0, (*receiver)->port());
  Result<std::shared_ptr<Destination>> dest = sender.resolve(d.asReader());
  ASSERT_TRUE(dest) << dest.error().message;
  const std::vector<uint32_t> src_ids = {3, 4, 5, 9, 10, 20};
  const std::vector<uint32_t> dst_ids = {10, 11, 12, 2, 3, 31};
  const auto done = kvrelay::testing::send_all_layers(
      sender, **dest, kGpuRdmaGeometry.total_layers(), 1, src_ids, dst_ids);
  ASSERT_EQ(done.size(), 3u);
  for (const TransferCompletion& c : done)
    ASSERT_TRUE(c.status) << c.status.error().message;
  EXPECT_EQ(kvrelay::testing::wrong_bytes(dst.mirror(), src_ids, dst_ids), 0u);
  EXPECT_EQ(fabric.dmabuf_registrations.load(), 2u) << "nothing registered by address";
  EXPECT_EQ((*receiver)->sessions().transfers.load(), 3u);
}

// Allocations of two tensors (a layer's K and V): a registration each. Of
// a tensor and a half: the tensor that runs past its allocation's end is
// registered by device address (nvidia-peermem), the rest by dma-buf.
TEST(RdmaGpuPool, RegistrationsEndWhereTheAllocationsEnd) {
  FakeFabric fabric;
  FakeDevicePool pool(kGpuRdmaGeometry, "pool");
  Result<std::unique_ptr<RegisteredPool>> per_layer = RegisteredPool::create(
      fabric, pool.pool(), pool.device()->dmabuf_exporter(2 * kGpuRdmaTensor));
  ASSERT_TRUE(per_layer) << per_layer.error().message;
  EXPECT_EQ((*per_layer)->registrations(), kGpuRdmaGeometry.total_layers());
  EXPECT_EQ((*per_layer)->dmabuf_registrations(), kGpuRdmaGeometry.total_layers());
  for (uint32_t l = 0; l < kGpuRdmaGeometry.total_layers(); ++l)
    EXPECT_EQ((*per_layer)->lkey(l, 0), (*per_layer)->lkey(l, 1)) << "layer " << l;

  Result<std::unique_ptr<RegisteredPool>> straddling = RegisteredPool::create(
      fabric, pool.pool(), pool.device()->dmabuf_exporter(3 * kGpuRdmaTensor / 2));
  ASSERT_TRUE(straddling) << straddling.error().message;
  EXPECT_GT((*straddling)->dmabuf_registrations(), 0u);
  EXPECT_LT((*straddling)->dmabuf_registrations(), (*straddling)->registrations());
}

TEST(RdmaGpuPool, APoolRegisterableNeitherWaySaysBothReasonsAndSuggestsTcp) {
  FakeFabric fabric;
  fabric.refuse_address_registrations = true;
  FakeDevicePool pool(kGpuRdmaGeometry, "pool");
  const kernels::DmabufExporter no_dmabuf = [](const std::byte*) -> Result<kernels::DmabufSpan> {
    return make_error(Errc::kUnsupported, "the CUDA driver cannot export dma-bufs");
  };
  Result<std::unique_ptr<RegisteredPool>> r =
      RegisteredPool::create(fabric, pool.pool(), no_dmabuf);
  ASSERT_FALSE(r);
  const std::string& why = r.error().message;
  EXPECT_NE(why.find("as a dma-buf: the CUDA driver cannot export dma-bufs"), std::string::npos)
      << why;
  EXPECT_NE(why.find("by device address (needs nvidia-peermem): ibv_reg_mr: Bad address"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("Use tcp"), std::string::npos) << why;
}

}  // namespace
}  // namespace kvrelay::worker::rdma
