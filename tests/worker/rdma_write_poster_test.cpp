// The rdma posting logic against in-process fake queue pairs: chains of at
// most 32 writes, signals spaced as promised, the last write of a transfer
// a signaled WRITE_WITH_IMM that reaches the peer, round robin over queue
// pairs or the one a transfer names, a full send queue that resumes from the
// refused write, and an error completion that fails only the transfers on
// its queue pair.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "worker/fake_queue_pair.h"
#include "worker/rdma/write_poster.h"

namespace kvrelay::worker::rdma {
namespace {

using testing::FakeQueuePair;

constexpr uint32_t kRkey = 77;
constexpr uint32_t kRun = 64;  // bytes per write

class WritePosterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_.resize(1 << 16);
    dst_.resize(1 << 16);
    std::iota(src_.begin(), src_.end(), uint8_t{0});
    for (auto& b : src_)
      b = static_cast<uint8_t>(b * 7 + 3);
  }
  FakeQueuePair& qp(std::string name, uint32_t slots) {
    qps_.push_back(std::make_unique<FakeQueuePair>(std::move(name), slots));
    FakeQueuePair& q = *qps_.back();
    q.register_remote(kRkey, reinterpret_cast<std::byte*>(dst_.data()), dst_.size());
    q.connect(&receiver_);
    return q;
  }
  // `count` writes of kRun bytes from offset `first * kRun` to the same offset.
  LayerWrite transfer(uint64_t id, uint32_t first, uint32_t count, uint32_t rkey = kRkey) {
    LayerWrite t;
    t.transfer = id;
    t.immediate = static_cast<uint32_t>(1000 + id);
    for (uint32_t i = 0; i < count; ++i) {
      WriteRequest w;
      w.local_address = reinterpret_cast<uint64_t>(src_.data()) + uint64_t{first + i} * kRun;
      w.remote_address = reinterpret_cast<uint64_t>(dst_.data()) + uint64_t{first + i} * kRun;
      w.length = kRun;
      w.rkey = rkey;
      t.writes.push_back(w);
    }
    for (uint32_t i = 0; i < 4096; ++i)
      (void)receiver_.post_receive(i);
    return t;
  }
  bool landed(uint32_t first, uint32_t count) const {
    return std::equal(src_.begin() + first * kRun, src_.begin() + (first + count) * kRun,
                      dst_.begin() + first * kRun);
  }
  std::vector<TransferDone> run(WritePoster& p, int rounds = 100) {
    std::vector<TransferDone> done;
    for (int i = 0; i < rounds && (p.transfers_in_flight() != 0 || i == 0); ++i)
      p.progress(done);
    return done;
  }
  std::vector<uint32_t> immediates() {
    std::vector<uint32_t> out;
    std::array<WorkCompletion, 64> wcs;
    for (size_t n; (n = receiver_.poll_receive(wcs)) != 0;)
      for (size_t i = 0; i < n; ++i)
        out.push_back(*wcs[i].immediate);
    return out;
  }

  std::vector<uint8_t> src_, dst_;
  std::vector<std::unique_ptr<FakeQueuePair>> qps_;
  FakeQueuePair receiver_{"peer", 1024};
};

// One call posts about kMaxPostBytesPerCall to a queue pair, and the rest
// as completions come: a software device (soft-RoCE) does its work inside
// the post, and a backlog posted at once stalled the thread past its
// heartbeats (a 64 MiB backlog closed the session).
TEST_F(WritePosterTest, OneCallPostsAboutAMebibyteAndTheRestAsCompletionsCome) {
  constexpr uint32_t kBig = 512u << 10;
  src_.assign(8u << 20, 0);
  dst_.assign(8u << 20, 0);
  for (size_t i = 0; i < src_.size(); ++i)
    src_[i] = static_cast<uint8_t>(i * 13 + 5);
  FakeQueuePair& q = qp("qp0", 256);
  WritePoster poster({&q}, 16);
  LayerWrite t = transfer(1, 0, 0);
  for (uint32_t i = 0; i < 16; ++i) {
    WriteRequest w;
    w.local_address = reinterpret_cast<uint64_t>(src_.data()) + uint64_t{i} * kBig;
    w.remote_address = reinterpret_cast<uint64_t>(dst_.data()) + uint64_t{i} * kBig;
    w.length = kBig;
    w.rkey = kRkey;
    t.writes.push_back(w);
  }
  poster.submit(std::move(t));
  EXPECT_EQ(q.executed.size(), WritePoster::kMaxPostBytesPerCall / kBig)
      << "a call posts about a MiB, not the whole transfer";
  const std::vector<TransferDone> done = run(poster);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status) << done[0].status.error().message;
  EXPECT_EQ(q.executed.size(), 16u);
  EXPECT_TRUE(std::equal(src_.begin(), src_.end(), dst_.begin()));
}

TEST_F(WritePosterTest, ATransferGoesOutInChainsOfAtMost32AndEndsWithOneSignaledImmediate) {
  FakeQueuePair& q = qp("qp0", 256);
  WritePoster poster({&q}, 16);
  poster.submit(transfer(1, 0, 100));
  const std::vector<TransferDone> done = run(poster);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].transfer, 1u);
  EXPECT_TRUE(done[0].status) << done[0].status.error().message;
  EXPECT_TRUE(landed(0, 100));
  for (size_t n : q.chain_sizes)
    EXPECT_LE(n, WritePoster::kMaxChain);
  ASSERT_EQ(q.executed.size(), 100u);
  uint32_t since = 0;
  for (size_t i = 0; i < q.executed.size(); ++i) {
    const WriteRequest& w = q.executed[i];
    EXPECT_EQ(w.immediate.has_value(), i + 1 == q.executed.size()) << "only the last carries one";
    since = w.signaled ? 0 : since + 1;
    EXPECT_LT(since, 16u) << "a signal at least every 16 writes";
  }
  EXPECT_TRUE(q.executed.back().signaled);
  EXPECT_EQ(immediates(), std::vector<uint32_t>{1001});
  EXPECT_EQ(q.outstanding(), 0u);
}

TEST_F(WritePosterTest, TransfersGoRoundRobinOverTheQueuePairsAndEachCompletesOnce) {
  FakeQueuePair& a = qp("qp0", 64);
  FakeQueuePair& b = qp("qp1", 64);
  WritePoster poster({&a, &b});
  for (uint64_t t = 0; t < 6; ++t)
    poster.submit(transfer(t, static_cast<uint32_t>(t * 10), 10));
  const std::vector<TransferDone> done = run(poster);
  ASSERT_EQ(done.size(), 6u);
  std::vector<uint64_t> ids;
  for (const TransferDone& d : done) {
    EXPECT_TRUE(d.status);
    ids.push_back(d.transfer);
  }
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(a.executed.size(), 30u);
  EXPECT_EQ(b.executed.size(), 30u);
  EXPECT_TRUE(landed(0, 60));
}

TEST_F(WritePosterTest, AFullSendQueueWaitsForCompletionsAndResumesInOrder) {
  FakeQueuePair& q = qp("qp0", 8);
  WritePoster poster({&q}, 4);
  q.hold_completions = true;
  poster.submit(transfer(1, 0, 50));
  poster.submit(transfer(2, 50, 3));
  std::vector<TransferDone> done;
  poster.progress(done);
  EXPECT_TRUE(done.empty());
  EXPECT_EQ(q.executed.size(), 8u) << "no more than the send queue holds";
  q.hold_completions = false;
  done = run(poster);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].transfer, 1u);
  EXPECT_EQ(done[1].transfer, 2u);
  EXPECT_LE(q.peak_outstanding, 8u);
  EXPECT_TRUE(landed(0, 53));
  for (size_t i = 1; i < q.executed.size(); ++i)
    EXPECT_EQ(q.executed[i].wr_id, q.executed[i - 1].wr_id + 1) << "posted in order, none twice";
}

TEST_F(WritePosterTest, ASendQueueThatRefusesPartWayIsPostedAgainFromTheRefusedWrite) {
  FakeQueuePair& q = qp("qp0", 64);
  q.real_slots = 20;  // ENOMEM at the 21st write of the first chain
  WritePoster poster({&q}, 16);
  poster.submit(transfer(1, 0, 40));
  const std::vector<TransferDone> done = run(poster);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status) << done[0].status.error().message;
  EXPECT_EQ(q.executed.size(), 40u) << "every write once: nothing lost or repeated at the cut";
  EXPECT_LE(q.peak_outstanding, 20u);
  EXPECT_TRUE(landed(0, 40));
}

// The one case posting cannot recover from: a send queue full of unsignaled
// writes never completes any. It must be an error, never a hang.
TEST_F(WritePosterTest, ASendQueueFullOfUnsignaledWritesFailsTheTransferInsteadOfHanging) {
  FakeQueuePair& q = qp("qp0", 64);
  q.real_slots = 10;  // fewer than the signal spacing
  WritePoster poster({&q}, 16);
  poster.submit(transfer(1, 0, 40));
  const std::vector<TransferDone> done = run(poster);
  ASSERT_EQ(done.size(), 1u);
  ASSERT_FALSE(done[0].status);
  EXPECT_NE(done[0].status.error().message.find("no signaled write outstanding"),
            std::string::npos);
  EXPECT_TRUE(poster.failed(0));
}

TEST_F(WritePosterTest, AnErrorCompletionFailsOnlyTheTransfersOnItsQueuePair) {
  FakeQueuePair& a = qp("qp0", 64);
  FakeQueuePair& b = qp("qp1", 64);
  a.fail_write_number = 3;
  a.hold_completions = true;  // so that a second transfer is on qp0 when it fails
  WritePoster poster({&a, &b});
  poster.submit(transfer(1, 0, 5));   // qp0: fails
  poster.submit(transfer(2, 10, 5));  // qp1
  poster.submit(transfer(3, 20, 5));  // qp0: posted behind the failure
  poster.submit(transfer(4, 30, 5));  // qp1
  a.hold_completions = false;
  const std::vector<TransferDone> done = run(poster);
  ASSERT_EQ(done.size(), 4u);
  for (const TransferDone& d : done) {
    if (d.transfer == 1 || d.transfer == 3) {
      ASSERT_FALSE(d.status) << d.transfer;
      EXPECT_NE(d.status.error().message.find("qp0"), std::string::npos);
      EXPECT_NE(d.status.error().message.find("retry counter exceeded"), std::string::npos);
    } else {
      EXPECT_TRUE(d.status) << d.transfer;
    }
  }
  EXPECT_TRUE(poster.failed(0));
  EXPECT_FALSE(poster.failed(1));
  EXPECT_TRUE(landed(10, 5));
  EXPECT_TRUE(landed(30, 5));

  // New work avoids the failed queue pair until it is replaced; then both serve.
  poster.submit(transfer(5, 40, 5));
  poster.submit(transfer(6, 50, 5));
  EXPECT_EQ(run(poster).size(), 2u);
  FakeQueuePair& fresh = qp("qp0-new", 64);
  poster.replace(0, &fresh);
  poster.submit(transfer(7, 60, 5));
  poster.submit(transfer(8, 70, 5));
  const std::vector<TransferDone> after = run(poster);
  ASSERT_EQ(after.size(), 2u);
  for (const TransferDone& d : after)
    EXPECT_TRUE(d.status);
  EXPECT_FALSE(fresh.executed.empty());
  EXPECT_TRUE(landed(40, 5));
  EXPECT_TRUE(landed(50, 5));
  EXPECT_TRUE(landed(60, 5));
  EXPECT_TRUE(landed(70, 5));
}

TEST_F(WritePosterTest, ATransfersNotYetStartedMoveToAWorkingQueuePair) {
  FakeQueuePair& a = qp("qp0", 4);
  FakeQueuePair& b = qp("qp1", 64);
  a.fail_write_number = 1;
  a.hold_completions = true;
  WritePoster poster({&a, &b});
  poster.submit(transfer(1, 0, 4));   // qp0: fills it, fails
  poster.submit(transfer(2, 8, 4));   // qp1
  poster.submit(transfer(3, 16, 4));  // qp0: waits for room, never started
  a.hold_completions = false;
  const std::vector<TransferDone> done = run(poster);
  ASSERT_EQ(done.size(), 3u);
  for (const TransferDone& d : done)
    EXPECT_EQ(d.status.ok(), d.transfer != 1) << d.transfer;
  EXPECT_TRUE(landed(16, 4)) << "moved to qp1 and written there";
}

// A transfer whose keys were granted for one queue pair goes on that one
// and never moves: on another its keys would fail (a memory window serves
// the queue pair it was bound on alone).
TEST_F(WritePosterTest, ATransferThatNamesItsQueuePairGoesThereAndFailsWithIt) {
  FakeQueuePair& a = qp("qp0", 4);
  FakeQueuePair& b = qp("qp1", 64);
  a.fail_write_number = 1;
  a.hold_completions = true;
  WritePoster poster({&a, &b});
  EXPECT_EQ(poster.next_queue_pair(), std::optional<size_t>(0));
  EXPECT_EQ(poster.next_queue_pair(), std::optional<size_t>(1));
  LayerWrite first = transfer(1, 0, 4);
  first.queue_pair = 0;  // fills qp0, fails
  LayerWrite second = transfer(2, 8, 4);
  second.queue_pair = 1;
  LayerWrite third = transfer(3, 16, 4);
  third.queue_pair = 0;  // waits for room on qp0, never started
  poster.submit(std::move(first));
  poster.submit(std::move(second));
  poster.submit(std::move(third));
  a.hold_completions = false;
  std::vector<TransferDone> done = run(poster);
  ASSERT_EQ(done.size(), 3u);
  for (const TransferDone& d : done)
    EXPECT_EQ(d.status.ok(), d.transfer == 2) << d.transfer;
  EXPECT_EQ(b.executed.size(), 4u) << "only transfer 2 went on qp1";
  EXPECT_FALSE(landed(16, 4));
  EXPECT_EQ(poster.next_queue_pair(), std::optional<size_t>(1)) << "qp0 failed";

  LayerWrite late = transfer(4, 24, 2);
  late.queue_pair = 0;
  poster.submit(std::move(late));
  LayerWrite nowhere = transfer(5, 28, 2);
  nowhere.queue_pair = 2;
  poster.submit(std::move(nowhere));
  done = run(poster);
  ASSERT_EQ(done.size(), 2u);
  ASSERT_FALSE(done[0].status);
  EXPECT_NE(done[0].status.error().message.find("qp0 has failed"), std::string::npos)
      << done[0].status.error().message;
  ASSERT_FALSE(done[1].status);
  EXPECT_NE(done[1].status.error().message.find("queue pair 2 of 2"), std::string::npos)
      << done[1].status.error().message;
}

TEST_F(WritePosterTest, ARemoteAccessErrorIsNamedAndWhenEveryQueuePairFailedNewWorkFailsAtOnce) {
  FakeQueuePair& a = qp("qp0", 64);
  WritePoster poster({&a});
  poster.submit(transfer(1, 0, 3, /*rkey=*/999));
  std::vector<TransferDone> done = run(poster);
  ASSERT_EQ(done.size(), 1u);
  ASSERT_FALSE(done[0].status);
  EXPECT_NE(done[0].status.error().message.find("remote access error"), std::string::npos);
  poster.submit(transfer(2, 8, 3));
  done = run(poster);
  ASSERT_EQ(done.size(), 1u);
  ASSERT_FALSE(done[0].status);
  EXPECT_NE(done[0].status.error().message.find("every queue pair"), std::string::npos);
}

}  // namespace
}  // namespace kvrelay::worker::rdma
