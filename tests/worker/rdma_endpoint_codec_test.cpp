// What rdma peers exchange over their control connection: a queue pair's
// address and the accepting side's tensors round-trip, and every field a
// peer could get wrong is refused with a message naming it.
#include <capnp/message.h>
#include <gtest/gtest.h>

#include "worker/rdma/endpoint_codec.h"

namespace kvrelay::worker::rdma {
namespace {

PoolGeometry geometry() {
  PoolGeometry g;
  g.num_layers = 2;
  g.extra_layers = 1;
  g.num_blocks = 8;
  g.extra_layer_blocks = 4;
  g.kv_heads = 1;
  g.block_size = 4;
  g.head_dim = 8;
  g.has_scales = 1;
  return g;
}

std::vector<RemoteTensor> tensors_of(const PoolGeometry& g) {
  std::vector<RemoteTensor> out;
  uint64_t at = 0x10000;
  for (uint32_t l = 0; l < g.total_layers(); ++l)
    for (uint32_t t = 0; t < g.tensors_per_layer(); ++t) {
      const uint64_t bytes = g.tensor_bytes(l, static_cast<PoolTensor>(t));
      out.push_back({at, 100 + l * 4 + t, bytes});
      at += bytes + 4096;
    }
  return out;
}

QpEndpoint endpoint() {
  QpEndpoint e;
  e.lid = 3;
  e.qpn = 0x11;
  e.psn = 0xabcdef;
  for (uint8_t i = 0; i < 16; ++i)
    e.gid[i] = i;
  e.mtu = 1024;
  return e;
}

std::string endpoint_error(const std::function<void(schema::RdmaQpInfo::Builder)>& spoil) {
  capnp::MallocMessageBuilder msg;
  auto b = msg.initRoot<schema::RdmaQpInfo>();
  encode_endpoint(endpoint(), b);
  spoil(b);
  Result<QpEndpoint> e = decode_endpoint(b.asReader());
  return e ? "" : e.error().message;
}

TEST(RdmaEndpointCodec, AQueuePairsAddressRoundTrips) {
  capnp::MallocMessageBuilder msg;
  encode_endpoint(endpoint(), msg.initRoot<schema::RdmaQpInfo>());
  Result<QpEndpoint> e = decode_endpoint(msg.getRoot<schema::RdmaQpInfo>().asReader());
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->lid, 3);
  EXPECT_EQ(e->qpn, 0x11u);
  EXPECT_EQ(e->psn, 0xabcdefu);
  EXPECT_EQ(e->gid, endpoint().gid);
  EXPECT_EQ(e->mtu, 1024u);
}

TEST(RdmaEndpointCodec, EveryBadFieldOfAnAddressIsRefusedByName) {
  EXPECT_NE(endpoint_error([](auto b) { b.setQpn(0); }).find("qpn"), std::string::npos);
  EXPECT_NE(endpoint_error([](auto b) { b.setQpn(1u << 24); }).find("qpn"), std::string::npos);
  EXPECT_NE(endpoint_error([](auto b) { b.setPsn(1u << 24); }).find("psn"), std::string::npos);
  EXPECT_NE(endpoint_error([](auto b) { b.setMtu(1500); }).find("mtu 1500"), std::string::npos);
  EXPECT_NE(endpoint_error([](auto b) { b.setMtu(8192); }).find("mtu"), std::string::npos);
  EXPECT_NE(endpoint_error([](auto b) { b.initGid(4); }).find("gid is 4 bytes"), std::string::npos);
}

TEST(RdmaEndpointCodec, TheTensorsRoundTripAndAddressesAreBoundsChecked) {
  const PoolGeometry g = geometry();
  const std::vector<RemoteTensor> t = tensors_of(g);
  capnp::MallocMessageBuilder msg;
  encode_regions(g, t, msg.initRoot<schema::RdmaMemoryRegions>());
  Result<RemoteTensors> r = decode_regions(msg.getRoot<schema::RdmaMemoryRegions>().asReader(), g);
  ASSERT_TRUE(r) << r.error().message;
  const uint64_t k0 = g.tensor_bytes(0, PoolTensor::kKey);
  EXPECT_EQ(*r->address(0, 0, 0, k0), t[0].address);
  EXPECT_EQ(*r->address(2, 3, 0, 16), t.back().address);
  for (const auto region : msg.getRoot<schema::RdmaMemoryRegions>().asReader().getRegions())
    EXPECT_EQ(region.getRkey(), 0u) << "an accept hands out no key; grants do";
  EXPECT_FALSE(r->address(0, 0, 1, k0)) << "one byte past the tensor";
  EXPECT_FALSE(r->address(0, 0, k0 + 1, 0));
  EXPECT_FALSE(r->address(0, 4, 0, 1)) << "no fifth tensor";
  EXPECT_FALSE(r->address(3, 0, 0, 1)) << "no fourth layer";
  EXPECT_FALSE(r->address(0, 0, UINT64_MAX, 2)) << "no wrap-around";
}

std::string regions_error(
    const std::function<void(std::vector<RemoteTensor>&)>& spoil,
    const std::function<void(schema::RdmaMemoryRegions::Builder)>& after = nullptr) {
  const PoolGeometry g = geometry();
  std::vector<RemoteTensor> t = tensors_of(g);
  spoil(t);
  capnp::MallocMessageBuilder msg;
  auto b = msg.initRoot<schema::RdmaMemoryRegions>();
  encode_regions(g, t, b);
  if (after) after(b);
  Result<RemoteTensors> r = decode_regions(b.asReader(), g);
  return r ? "" : r.error().message;
}

TEST(RdmaEndpointCodec, RegionsThatDoNotCoverThePoolExactlyAreRefused) {
  EXPECT_NE(regions_error([](auto& t) { t.pop_back(); }).find("11 regions"), std::string::npos);
  EXPECT_NE(regions_error([](auto& t) { t[2].bytes += 1; }).find("not the pool's"),
            std::string::npos);
  EXPECT_NE(regions_error([](auto& t) { t[1].address = 0; }).find("not a usable"),
            std::string::npos);
  EXPECT_NE(regions_error([](auto& t) { t[1].address = UINT64_MAX - 8; }).find("not a usable"),
            std::string::npos);
  EXPECT_NE(regions_error([](auto&) {}, [](auto b) { b.getRegions()[1].setTensor(0); })
                .find("given twice"),
            std::string::npos);
  EXPECT_NE(regions_error([](auto&) {}, [](auto b) { b.getRegions()[0].setLayer(9); })
                .find("does not have"),
            std::string::npos);
}

}  // namespace
}  // namespace kvrelay::worker::rdma
