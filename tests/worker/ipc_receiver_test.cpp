// Both sides of ipc into a decode rank (the pool writer and the receiver) in one process, over a real
// decode control segment: the writer (a prefill worker's) checks the rank's
// claims before each write and says what landed; the rank replays that into
// its expected requests. A record the full ring has no room for waits at the
// writer, with its announcement, and goes out in order once there is room.
#include "worker/ipc/ipc_receiver.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "schemas/codec.h"
#include "shm/clock.h"
#include "support/processes.h"
#include "worker/ipc/ipc_pool_writer.h"
#include "worker/request_key.h"

namespace kvrelay::worker {
namespace {

class IpcReceiverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name = testing::current_test_instance();
    config_ = default_config(name, 1);
    config_.role = static_cast<uint32_t>(Role::kDecode);
    config_.num_layers = 2;
    config_.num_blocks = 64;
    Result<ControlSegment> c = ControlSegment::create(config_);
    ASSERT_TRUE(c) << c.error().message;
    control_ = std::make_unique<ControlSegment>(std::move(c).value());
    geometry_ = pool_geometry_of(config_, PoolTier::kDevice);
    arrivals_ = std::make_shared<Arrivals>(geometry_, nullptr);
    Result<std::unique_ptr<IpcReceiver>> receiver = IpcReceiver::open(*control_, 0, geometry_, arrivals_);
    ASSERT_TRUE(receiver) << receiver.error().message;
    ipc_receiver_ = std::move(receiver).value();
    Result<ControlSegment> attached = ControlSegment::attach(name);  // as a prefill worker would
    ASSERT_TRUE(attached) << attached.error().message;
    Result<std::shared_ptr<IpcPoolWriter>> writer = IpcPoolWriter::open(
        std::make_shared<const ControlSegment>(std::move(attached).value()), 0);
    ASSERT_TRUE(writer) << writer.error().message;
    writer_ = std::move(writer).value();
  }
  void TearDown() override {
    writer_.reset();
    ipc_receiver_.reset();
    if (control_) (void)control_->unlink();
  }
  void expect(uint64_t handle, const std::string& id, const std::vector<uint32_t>& blocks) {
    ASSERT_TRUE(arrivals_->expect(handle, id, blocks));
    ASSERT_TRUE(ipc_receiver_->expect(handle, request_key(id), blocks));
  }
  // What a prefill worker does for one layer of `runs`.
  Status write(const std::string& id, uint32_t layer, const std::vector<BlockRun>& runs) {
    Status s = writer_->admit(request_key(id), layer, runs);
    if (s) writer_->landed(request_key(id), layer, runs);
    return s;
  }

  InstanceConfig config_{};
  PoolGeometry geometry_;
  std::unique_ptr<ControlSegment> control_;
  std::shared_ptr<Arrivals> arrivals_;
  std::unique_ptr<IpcReceiver> ipc_receiver_;
  std::shared_ptr<IpcPoolWriter> writer_;
};

// The rank opens a claim by publishing its entry, then its blocks' claims:
// a writer that looks in between (here: the claims held back by hand for
// 1 ms) must not refuse its own request's write as undeclared.
TEST_F(IpcReceiverTest, AWriteThatLooksWhileItsRequestsClaimIsBeingOpenedIsAdmitted) {
  expect(1, "opening", {20, 21, 22});
  auto* claims = reinterpret_cast<std::atomic<uint32_t>*>(control_->claim_table(0).data() +
                                                          sizeof(ClaimTableHeader));
  const uint32_t entry = claims[20].load();
  ASSERT_NE(entry, 0u);
  for (uint32_t b : {20u, 21u, 22u})
    claims[b].store(0);  // the entry is out, its claims are not
  std::thread owner([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (uint32_t b : {20u, 21u, 22u})
      claims[b].store(entry, std::memory_order_release);
  });
  const Status s = write("opening", 0, {{0, 20, 3}});
  owner.join();
  EXPECT_TRUE(s) << s.error().message;
  // A write to a block the open request really did not declare is still refused.
  const Status stray = write("opening", 1, {{0, 40, 1}});
  ASSERT_FALSE(stray);
  EXPECT_EQ(stray.error().message,
            "a write of the request goes to destination block 40 of decode rank 0, which it did "
            "not declare");
}

TEST_F(IpcReceiverTest, WritersSkipTheClaimsUntilTheDecodeEngineDeclaresARequest) {
  EXPECT_FALSE(writer_->in_use()) << "nobody declared anything: nothing to check or tell";
  mark_claim_table_in_use(control_->claim_table(0));  // what Client::submit(ExpectSpec) does first
  EXPECT_TRUE(writer_->in_use());
}

TEST_F(IpcReceiverTest, WhatTheWriterSaysLandedCompletesTheExpectedRequestOnce) {
  expect(1, "r", {4, 5, 6});
  for (uint32_t l = 0; l < 2; ++l)
    ASSERT_TRUE(write("r", l, {{0, 4, 3}}));
  EXPECT_GT(ipc_receiver_->drain(), 0u);
  auto events = arrivals_->take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kArrived);
  EXPECT_EQ(events[0].bytes, 2 * 2 * 3 * geometry_.block_bytes(PoolTensor::kKey));
  ipc_receiver_->close(1);
  EXPECT_TRUE(ipc_receiver_->settled(1));
  Status late = write("r", 0, {{0, 4, 1}});
  ASSERT_FALSE(late);
  EXPECT_NE(late.error().message.find("already arrived"), std::string::npos)
      << late.error().message;
}

TEST_F(IpcReceiverTest, TheWriterRefusesForeignWritesAndTellsTheRankOfAStrayOne) {
  expect(1, "owner", {10, 11});
  Status foreign = write("intruder", 0, {{0, 11, 1}});
  ASSERT_FALSE(foreign);
  EXPECT_NE(foreign.error().message.find("declared by another request"), std::string::npos);
  Status stray = write("owner", 0, {{0, 11, 2}});  // 11 and 12: 12 is not its
  ASSERT_FALSE(stray);
  EXPECT_NE(stray.error().message.find("did not declare"), std::string::npos);
  EXPECT_GT(ipc_receiver_->drain(), 0u);
  auto events = arrivals_->take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kFailed);
  EXPECT_NE(events[0].message.find("which it did not declare"), std::string::npos);
}

TEST_F(IpcReceiverTest, RecordsThatFindTheRingFullWaitAtTheWriterAndHoldUpAWithdrawal) {
  expect(1, "big", {0});
  // Fill the ring with records of another (undeclared) request's writes.
  int written = 0;
  while (!writer_->backlog() && written < 100000) {
    ASSERT_TRUE(write("filler", 1, {{0, 30, 1}}));
    ++written;
  }
  ASSERT_TRUE(writer_->backlog()) << "the ring never filled";
  ASSERT_TRUE(writer_->admit(request_key("big"), 0, std::vector<BlockRun>{{0, 0, 1}}));
  writer_->landed(request_key("big"), 0, std::vector<BlockRun>{{0, 0, 1}});
  ipc_receiver_->close(1);  // withdrawn while its record waits at the writer
  EXPECT_FALSE(ipc_receiver_->settled(1)) << "its write may still be in progress";
  while (ipc_receiver_->readable() || writer_->backlog()) {
    ipc_receiver_->drain(1024);
    writer_->flush();
  }
  EXPECT_TRUE(ipc_receiver_->settled(1)) << "every record went out; nothing is announced any more";
}

// A landed record carries its writer's stamp: the rank times how long the
// record waited (hop_landed_to_read) and an arrived request's latest stamp
// (the tail). A stamp from another process may be anything: 0 and one from
// the future are not timed, and none changes what the record does.
TEST_F(IpcReceiverTest, ALandedRecordsStampIsTimedOnlyWhenItIsFromThePast) {
  std::vector<uint64_t> hops;
  ipc_receiver_->set_hop_observer([&](uint64_t ns) { hops.push_back(ns); });
  expect(1, "unstamped", {7});
  expect(2, "stamped", {8});
  Result<MpscProducer> producer = control_->landed_ring(0)->lease_producer();
  ASSERT_TRUE(producer) << producer.error().message;
  auto push = [&](const std::string& id, uint32_t layer, uint32_t block, uint64_t stamp) {
    capnp::MallocMessageBuilder message;
    auto landed = message.initRoot<schema::IpcLanded>();
    landed.setRequestKey(request_key(id));
    landed.setLayer(layer);
    landed.initFirstBlocks(1).set(0, block);
    landed.initBlockCounts(1).set(0, 1);
    landed.setLandedNs(stamp);
    std::vector<std::byte> bytes(messages::encoded_bytes(message));
    messages::encode_into(message, bytes);
    ASSERT_TRUE(producer->try_write(static_cast<int32_t>(schema::MessageType::IPC_LANDED), bytes));
  };
  const uint64_t now = mono_now_ns();
  const uint64_t hour_ahead = now + uint64_t{3600} * 1000 * 1000 * 1000;
  const uint64_t five_ms_ago = now - uint64_t{5'000'000};
  push("unstamped", 0, 7, 0);
  push("unstamped", 1, 7, hour_ahead);
  push("stamped", 0, 8, five_ms_ago - 1000);
  push("stamped", 1, 8, five_ms_ago);
  EXPECT_EQ(ipc_receiver_->drain(), 4u);
  ASSERT_EQ(hops.size(), 2u) << "neither the missing stamp nor the one from the future";
  for (uint64_t ns : hops)
    EXPECT_GE(ns, 5'000'000u);
  auto events = arrivals_->take();
  ASSERT_EQ(events.size(), 2u) << "both arrived: a stamp changes nothing";
  for (const ArrivalEvent& e : events) {
    EXPECT_EQ(e.kind, ArrivalEvent::kArrived);
    // The latest stamp, as sent: the worker checks it before timing.
    EXPECT_EQ(e.last_landed_ns, e.handle == 1 ? hour_ahead : five_ms_ago) << e.handle;
  }
}

// The writer stamps every record when it says what landed.
TEST_F(IpcReceiverTest, TheWriterStampsWhatLanded) {
  std::vector<uint64_t> hops;
  ipc_receiver_->set_hop_observer([&](uint64_t ns) { hops.push_back(ns); });
  expect(1, "r", {4});
  const uint64_t before = mono_now_ns();
  for (uint32_t l = 0; l < 2; ++l)
    ASSERT_TRUE(write("r", l, {{0, 4, 1}}));
  const uint64_t after = mono_now_ns();
  EXPECT_EQ(ipc_receiver_->drain(), 2u);
  EXPECT_EQ(hops.size(), 2u);
  auto events = arrivals_->take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_GE(events[0].last_landed_ns, before);
  EXPECT_LE(events[0].last_landed_ns, after);
}

}  // namespace
}  // namespace kvrelay::worker
