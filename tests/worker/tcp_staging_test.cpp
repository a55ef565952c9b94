// The tcp transport on pools in GPU memory, without a GPU: the pools are
// FakeDevicePools (support/fake_device.h), whose addresses the CPU cannot
// touch, so a payload that did not go through the stager's copy engine
// crashes the test. What arrives byte for byte in every pairing of GPU and
// host pools, with staging slots smaller than a frame, that a transfer is
// acked only once its bytes are on the device, and what a copy fault or a
// missing stager says.
#include <capnp/message.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <thread>

#include "support/fake_device.h"
#include "support/pool_patterns.h"
#include "worker/receiver.h"
#include "worker/tcp/frame_plan.h"
#include "worker/tcp/staging.h"
#include "worker/tcp/tcp_transport.h"

namespace kvrelay::worker::tcp {
namespace {

using namespace std::chrono_literals;
using kvrelay::testing::FakeDeviceEngine;
using kvrelay::testing::FakeDevicePool;
using kvrelay::testing::FakeEngineControl;
using kvrelay::testing::FlatPool;

const PoolGeometry kStagedGeometry = kvrelay::testing::transport_geometry();
const uint64_t kStagedBlock = kStagedGeometry.block_bytes(PoolTensor::kKey);  // 4 KiB

// A host pool of the same layout, in ordinary memory.
struct HostFlatPool {
  std::vector<std::byte> bytes = std::vector<std::byte>(FlatPool::bytes_for(kStagedGeometry));
  FlatPool pool{kStagedGeometry, bytes.data(), kernels::MemoryKind::kHost, "host"};
};

class TcpStagingTest : public ::testing::Test {
 protected:
  void TearDown() override {
    sender.reset();
    receiver.reset();
  }

  static net::Timing staged_timing() {
    net::Timing t;
    t.heartbeat = 20ms;
    t.peer_timeout = 2000ms;
    return t;
  }
  static std::shared_ptr<Stager> stager_for(const FakeDevicePool& p,
                                            const std::shared_ptr<FakeEngineControl>& control,
                                            uint64_t slot_bytes = 8ull << 20) {
    Stager::Options o;
    o.slot_bytes = slot_bytes;
    o.pin = false;
    return std::make_shared<Stager>(std::make_unique<FakeDeviceEngine>(p.device(), control),
                                    kernels::MemoryKind::kCuda, o);
  }
  void listen_on(const LocalPool& pool, std::shared_ptr<Stager> stager) {
    ReceiverOptions o;
    o.instance = "d";
    o.timing = staged_timing();
    o.stager = std::move(stager);
    o.stage_at_handshake = true;  // as a worker's tcp listener
    Result<std::unique_ptr<Receiver>> r = Receiver::start(net, pool, key, o);
    ASSERT_TRUE(r) << r.error().message;
    receiver = std::move(r).value();
  }
  void send_from(const LocalPool& pool, std::shared_ptr<Stager> stager) {
    SenderOptions o;
    o.instance = "p";
    o.lanes = 2;
    o.timing = staged_timing();
    o.stager = std::move(stager);
    sender = std::make_unique<TcpTransport>(net, pool, &key, o, nullptr);
  }
  std::vector<TransferCompletion> send_layers(uint64_t handle, const std::vector<uint32_t>& src_ids,
                                              const std::vector<uint32_t>& dst_ids) {
    std::shared_ptr<Destination> dest =
        kvrelay::testing::loopback_tcp_destination(*sender, {receiver->port()});
    if (!dest) return {};
    return kvrelay::testing::send_all_layers(*sender, *dest, kStagedGeometry.total_layers(), handle,
                                             src_ids, dst_ids);
  }

  AuthKey key = AuthKey::from_bytes(std::vector<uint8_t>(32, 7));
  net::NetThread net;
  std::unique_ptr<Receiver> receiver;
  std::unique_ptr<TcpTransport> sender;
};

const std::vector<uint32_t> kStagedSrc = {3, 4, 5, 9, 1, 20, 21, 22, 23};
const std::vector<uint32_t> kStagedDst = {10, 11, 12, 2, 30, 13, 14, 15, 16};

TEST_F(TcpStagingTest, GpuToGpuArrivesByteForByteAndIsOnTheDeviceWhenAcked) {
  FakeDevicePool src(kStagedGeometry, "src"), dst(kStagedGeometry, "dst");
  kvrelay::testing::fill(src.mirror());
  auto out = std::make_shared<FakeEngineControl>();
  auto in = std::make_shared<FakeEngineControl>();
  in->delay = 20ms;  // an ack sent before the copy ended would find old bytes below
  listen_on(dst.pool(), stager_for(dst, in));
  send_from(src.pool(), stager_for(src, out));
  const auto done = send_layers(1, kStagedSrc, kStagedDst);
  // Checked at once: every completion means "on the device".
  const uint64_t wrong = kvrelay::testing::wrong_bytes(dst.mirror(), kStagedSrc, kStagedDst);
  ASSERT_EQ(done.size(), 3u);
  const uint64_t layer_bytes = kStagedSrc.size() * 2 * kStagedBlock;
  for (const TransferCompletion& c : done) {
    ASSERT_TRUE(c.status) << c.status.error().message;
    EXPECT_EQ(c.bytes, layer_bytes);
  }
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(out->bytes_to_host.load(), 3 * layer_bytes) << "every byte sent was staged";
  EXPECT_EQ(in->bytes_to_device.load(), 3 * layer_bytes) << "every byte received was staged";
  EXPECT_EQ(receiver->frames().refused_frames.load(), 0u);
  // Four scattered runs a tensor, sent from a slot as one frame of runs.
  EXPECT_EQ(receiver->frames().frames.load(), 3u * 2) << "a frame per layer and tensor";
}

// The page-locking of staging memory is paid when a connection is made
// (a ConnectTask, ahead of the requests), not by the first transfer: both
// sides have made their slots by the time the ConnectTask is answered, and
// the transfers make none.
TEST_F(TcpStagingTest, AConnectTaskMakesTheStagingSlotsOfBothSidesBeforeAnyTransfer) {
  FakeDevicePool src(kStagedGeometry, "src"), dst(kStagedGeometry, "dst");
  kvrelay::testing::fill(src.mirror());
  auto control = std::make_shared<FakeEngineControl>();
  std::shared_ptr<Stager> in = stager_for(dst, control), out = stager_for(src, control);
  listen_on(dst.pool(), in);
  send_from(src.pool(), out);
  capnp::MallocMessageBuilder m;
  auto connect = m.initRoot<schema::ConnectTask>();
  connect.setProtocol(schema::TransferProtocol::TCP);
  connect.setPeerAddress("127.0.0.1");
  connect.setPeerInstance("d");
  connect.initPorts(1).set(0, receiver->port());
  ASSERT_TRUE(sender->check_connect(connect.asReader()));
  EXPECT_GE(out->slot_sets_made(), 1u) << "the lane that answered has its slots";
  EXPECT_GE(in->slot_sets_made(), 1u) << "so has the connection that accepted it";
  for (int i = 0; i < 500 && (out->slot_sets_made() < 2 || in->slot_sets_made() < 2); ++i)
    std::this_thread::sleep_for(2ms);
  ASSERT_EQ(out->slot_sets_made(), 2u) << "one set per lane";
  ASSERT_EQ(in->slot_sets_made(), 2u);
  EXPECT_EQ(control->batches.load(), 0u) << "nothing moved yet";
  for (const TransferCompletion& c : send_layers(1, kStagedSrc, kStagedDst))
    EXPECT_TRUE(c.status) << c.status.error().message;
  EXPECT_EQ(kvrelay::testing::wrong_bytes(dst.mirror(), kStagedSrc, kStagedDst), 0u);
  EXPECT_EQ(out->slot_sets_made(), 2u) << "the transfers made no more";
  EXPECT_EQ(in->slot_sets_made(), 2u);
}

// Slots of one block: a sender splits its coalesced runs into a frame per
// block, and a receiver reads a frame of many blocks (a host sender's) a
// slot at a time, waiting for a slot to come back from the device.
TEST_F(TcpStagingTest, SlotsSmallerThanAFrameInEveryPairingOfGpuAndHostPools) {
  struct Case {
    bool gpu_src, gpu_dst;
  };
  for (const Case c : {Case{true, true}, Case{false, true}, Case{true, false}}) {
    SCOPED_TRACE(fmt::format("{} -> {}", c.gpu_src ? "gpu" : "host", c.gpu_dst ? "gpu" : "host"));
    FakeDevicePool gsrc(kStagedGeometry, "src"), gdst(kStagedGeometry, "dst");
    HostFlatPool hsrc, hdst;
    const LocalPool& src = c.gpu_src ? gsrc.pool() : hsrc.pool;
    const LocalPool& dst = c.gpu_dst ? gdst.pool() : hdst.pool;
    const LocalPool& dst_view = c.gpu_dst ? gdst.mirror() : hdst.pool;
    kvrelay::testing::fill(c.gpu_src ? gsrc.mirror() : hsrc.pool);
    auto out = std::make_shared<FakeEngineControl>();
    auto in = std::make_shared<FakeEngineControl>();
    out->delay = in->delay = 200us;
    listen_on(dst, c.gpu_dst ? stager_for(gdst, in, kStagedBlock) : nullptr);
    send_from(src, c.gpu_src ? stager_for(gsrc, out, kStagedBlock) : nullptr);
    const auto done = send_layers(2, kStagedSrc, kStagedDst);
    ASSERT_EQ(done.size(), 3u);
    for (const TransferCompletion& t : done)
      ASSERT_TRUE(t.status) << t.status.error().message;
    EXPECT_EQ(kvrelay::testing::wrong_bytes(dst_view, kStagedSrc, kStagedDst), 0u);
    const uint64_t total = 3 * kStagedSrc.size() * 2 * kStagedBlock;
    // A batch per slot: one block each.
    if (c.gpu_src) {
      EXPECT_EQ(out->batches.load(), total / kStagedBlock);
    }
    if (c.gpu_dst) {
      EXPECT_EQ(in->batches.load(), total / kStagedBlock);
    }
    sender.reset();
    receiver.reset();
  }
}

TEST_F(TcpStagingTest, AFaultCopyingIntoTheDeviceFailsItsTransferSayingSo) {
  FakeDevicePool dst(kStagedGeometry, "dst");
  HostFlatPool src;
  kvrelay::testing::fill(src.pool);
  auto in = std::make_shared<FakeEngineControl>();
  in->fail_from_batch = 1;
  listen_on(dst.pool(), stager_for(dst, in));
  send_from(src.pool, nullptr);
  const auto done = send_layers(3, {1, 2}, {3, 4});
  ASSERT_EQ(done.size(), 3u);
  size_t named = 0;
  for (const TransferCompletion& c : done) {
    ASSERT_FALSE(c.status) << "nothing landed, nothing may be acked";
    named += c.status.error().message.find(
                 "staging into GPU memory on fake device failed: fake device: an injected copy "
                 "fault") != std::string::npos;
  }
  EXPECT_GE(named, 1u) << done[0].status.error().message;
}

TEST_F(TcpStagingTest, AFaultCopyingFromTheDeviceFailsTheLanesTransfersSayingSo) {
  FakeDevicePool src(kStagedGeometry, "src");
  HostFlatPool dst;
  kvrelay::testing::fill(src.mirror());
  auto out = std::make_shared<FakeEngineControl>();
  out->fail_from_batch = 1;
  listen_on(dst.pool, nullptr);
  send_from(src.pool(), stager_for(src, out));
  const auto done = send_layers(4, {1, 2}, {3, 4});
  ASSERT_EQ(done.size(), 3u);
  for (const TransferCompletion& c : done) {
    ASSERT_FALSE(c.status);
    EXPECT_NE(c.status.error().message.find("staging from GPU memory on fake device failed"),
              std::string::npos)
        << c.status.error().message;
  }
  EXPECT_EQ(kvrelay::testing::wrong_bytes(dst.pool, {}, {}), 0u) << "nothing was written";
}

TEST_F(TcpStagingTest, AGpuPoolWithoutAStagerIsRefusedSayingSoOnEitherSide) {
  FakeDevicePool gpu(kStagedGeometry, "gpu");
  HostFlatPool host;
  kvrelay::testing::fill(host.pool);
  listen_on(host.pool, nullptr);
  send_from(gpu.pool(), nullptr);
  auto done = send_layers(5, {1}, {1});
  ASSERT_EQ(done.size(), 3u);
  ASSERT_FALSE(done[0].status);
  EXPECT_NE(done[0].status.error().message.find("has no staging for it"), std::string::npos)
      << done[0].status.error().message;
  sender.reset();
  receiver.reset();

  listen_on(gpu.pool(), nullptr);
  send_from(host.pool, nullptr);
  done = send_layers(6, {1}, {1});
  ASSERT_EQ(done.size(), 3u);
  ASSERT_FALSE(done[0].status);
  EXPECT_NE(done[0].status.error().message.find("its tcp listener has no staging for it"),
            std::string::npos)
      << done[0].status.error().message;
  EXPECT_EQ(receiver->frames().refused_frames.load(), 3u);
}

// A receiver stopped while its copies into the device are queued: it waits
// for them (none writes into the pool after it is gone, or the pool's
// unmapping below would fault), the stager it alone held ends with it, and
// every transfer gets its one completion.
TEST_F(TcpStagingTest, AReceiverStoppedWithCopiesInFlightEndsCleanlyAndEveryTransferCompletes) {
  auto dst = std::make_unique<FakeDevicePool>(kStagedGeometry, "dst");
  HostFlatPool src;
  kvrelay::testing::fill(src.pool);
  auto in = std::make_shared<FakeEngineControl>();
  in->delay = 20ms;
  listen_on(dst->pool(), stager_for(*dst, in, kStagedBlock));
  send_from(src.pool, nullptr);
  std::shared_ptr<Destination> dest =
      kvrelay::testing::loopback_tcp_destination(*sender, {receiver->port()});
  ASSERT_TRUE(dest);
  Result<std::vector<BlockRun>> runs = plan_block_runs(
      kStagedSrc, kStagedDst, kStagedGeometry.num_blocks, kStagedGeometry.num_blocks, 0, 0);
  ASSERT_TRUE(runs);
  for (uint32_t l = 0; l < kStagedGeometry.total_layers(); ++l) {
    TransferTicket t;
    t.handle = 8;
    t.layer = l;
    ASSERT_TRUE(dest->submit_layer(t, l, *runs));
  }
  while (in->batches.load() == 0)
    std::this_thread::sleep_for(1ms);
  receiver.reset();
  dst.reset();  // unmapped: a copy after the receiver's end would fault
  const auto done = kvrelay::testing::wait_for_completions(*sender, 3);
  ASSERT_EQ(done.size(), 3u) << "each transfer completes once, ok or not";
  size_t failed = 0;
  for (const TransferCompletion& c : done)
    failed += c.status ? 0 : 1;
  EXPECT_GE(failed, 1u) << "the receiver stopped before it could take everything";
}

// Heterogeneous TP (tp 1 with 2 heads -> tp 2 with 1 each) between GPU
// pools: a frame per block and decode rank, each staged on both sides, and
// every head on the device when its completion comes.
TEST_F(TcpStagingTest, AHeadShareBetweenGpuPoolsIsOnTheDeviceAtItsCompletion) {
  PoolGeometry half = kStagedGeometry;
  half.kv_heads = 1;
  FakeDevicePool src(kStagedGeometry, "src");
  kvrelay::testing::fill(src.mirror());
  std::vector<std::unique_ptr<FakeDevicePool>> decode;
  std::vector<std::unique_ptr<Receiver>> receivers;
  auto in = std::make_shared<FakeEngineControl>();
  in->delay = 1ms;
  for (uint32_t r = 0; r < 2; ++r) {
    decode.push_back(std::make_unique<FakeDevicePool>(half, fmt::format("half{}", r)));
    ReceiverOptions o;
    o.instance = "d";
    o.rank = r;
    o.heads = HeadLayout{2, 1, 2};
    o.timing = staged_timing();
    o.stager = stager_for(*decode.back(), in);
    Result<std::unique_ptr<Receiver>> started = Receiver::start(net, decode.back()->pool(), key, o);
    ASSERT_TRUE(started) << started.error().message;
    receivers.push_back(std::move(started).value());
  }
  send_from(src.pool(), stager_for(src, std::make_shared<FakeEngineControl>()));
  std::shared_ptr<Destination> dest = kvrelay::testing::loopback_tcp_destination(
      *sender, {receivers[0]->port(), receivers[1]->port()});
  ASSERT_TRUE(dest);
  ASSERT_EQ(dest->transfers_per_submit(), 2u);
  std::vector<uint32_t> src_ids, dst_ids;
  for (uint32_t b = 0; b < 12; ++b) {
    src_ids.push_back(4 + b);
    dst_ids.push_back(6 + b);
  }
  const auto done =
      kvrelay::testing::send_all_layers(*sender, *dest, half.total_layers(), 7, src_ids, dst_ids);
  std::vector<uint64_t> wrong;
  for (uint32_t r = 0; r < 2; ++r)
    wrong.push_back(kvrelay::testing::wrong_head_bytes(src.mirror(), r, decode[r]->mirror(), 0, 1,
                                                       src_ids, dst_ids));
  ASSERT_EQ(done.size(), 2u * 3u) << "a completion per layer and decode rank";
  for (const TransferCompletion& c : done)
    ASSERT_TRUE(c.status) << c.status.error().message;
  for (uint32_t r = 0; r < 2; ++r)
    EXPECT_EQ(wrong[r], 0u) << "decode rank " << r;
  sender.reset();
  receivers.clear();
}

TEST(SplitToFit, WholeBlocksUpToTheLimitAndOnlyTheFinalPieceIsLast) {
  PlannedFrame f;
  f.header.tensor = 1;
  f.header.dst_offset = 4 * kStagedBlock;
  f.header.bytes = 7 * kStagedBlock;
  f.header.last = true;
  f.src_offset = 10 * kStagedBlock;
  std::deque<PlannedFrame> out;
  split_to_fit(f, kStagedGeometry, 3 * kStagedBlock + 100, out);
  ASSERT_EQ(out.size(), 3u);
  const uint64_t sizes[] = {3, 3, 1};
  uint64_t at = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].header.bytes, sizes[i] * kStagedBlock);
    EXPECT_EQ(out[i].header.dst_offset, (4 + at) * kStagedBlock);
    EXPECT_EQ(out[i].src_offset, (10 + at) * kStagedBlock);
    EXPECT_EQ(out[i].header.last, i == 2);
    EXPECT_TRUE(check_frame(out[i].header, kStagedGeometry)) << i;
    at += sizes[i];
  }
  out.clear();
  f.header.last = false;
  split_to_fit(f, kStagedGeometry, 7 * kStagedBlock, out);
  ASSERT_EQ(out.size(), 1u) << "a frame that fits stays whole";
  EXPECT_FALSE(out[0].header.last);
}

}  // namespace
}  // namespace kvrelay::worker::tcp
