// The registry's promise: a transport is one folder and one row. The
// loopback transport (tests/worker/loopback/) is added here with its row
// alone, and Transports serves it like any other: it resolves a CacheDest
// of the row's protocol to it, and its layers land byte for byte.
#include "worker/loopback/loopback_transport.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include "support/pool_patterns.h"
#include "worker/transports.h"

namespace kvrelay::worker {
namespace {

// protocol (any value the schema has: rows are this table, not the
// schema's list)        name        its listener's port  rides along  build
constexpr TransportRow kRows[] = {
    {schema::TransferProtocol::TCP, "loopback", nullptr, false, &loopback::build},
};

TEST(LoopbackTransport, ATransportIsOneFolderAndOneRegistryRow) {
  const PoolGeometry g = kvrelay::testing::transport_geometry();
  auto src = kvrelay::testing::make_test_pool("loopback", "src", g);
  auto dst = kvrelay::testing::make_test_pool("loopback", "dst", g);
  kvrelay::testing::fill(*src);
  loopback::register_pool("d", dst.get());
  const InstanceConfig config = default_config("loopback-test", 1);
  const NetworkOptions network;
  Result<std::unique_ptr<Transports>> transports =
      Transports::create(config, 0, *src, network, nullptr, nullptr, kRows);
  ASSERT_TRUE(transports) << transports.error().message;
  ASSERT_NE((*transports)->find("loopback"), nullptr);
  EXPECT_EQ((*transports)->find("tcp"), nullptr) << "only the rows given";

  capnp::MallocMessageBuilder m;
  auto d = m.initRoot<schema::CacheDest>();
  d.setProtocol(schema::TransferProtocol::TCP);
  d.setPeerInstance("d");
  Result<std::shared_ptr<Destination>> dest = (*transports)->resolve(d.asReader());
  ASSERT_TRUE(dest) << dest.error().message;
  const std::vector<uint32_t> src_ids{3, 4, 5, 20}, dst_ids{9, 10, 11, 1};
  const auto done = kvrelay::testing::send_all_layers(**transports, **dest, g.total_layers(), 1,
                                                      src_ids, dst_ids);
  ASSERT_EQ(done.size(), g.total_layers());
  for (const TransferCompletion& c : done)
    EXPECT_TRUE(c.status) << c.status.error().message;
  EXPECT_EQ(kvrelay::testing::wrong_bytes(*dst, src_ids, dst_ids), 0u);

  d.setPeerInstance("nobody");
  Result<std::shared_ptr<Destination>> none = (*transports)->resolve(d.asReader());
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("no loopback pool 'nobody'"), std::string::npos);
  loopback::forget_pool("d");
  transports->reset();
  (void)src->segment().unlink();
  (void)dst->segment().unlink();
}

}  // namespace
}  // namespace kvrelay::worker
