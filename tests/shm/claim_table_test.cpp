// Claims on a pool's blocks (the ipc receiver): a writer sees exactly the
// owner's open claims, a closed key is refused for a while and its blocks are
// free at once, and a close waits for exactly the writers that may have
// admitted a write before it: not for later ones, and not for a dead one
// (tests/instance/landed_rings_test.cpp kills a real writer process).
#include "shm/claim_table.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace kvrelay {
namespace {

constexpr uint32_t kBlocks = 64;
constexpr uint64_t kSecond = 1'000'000'000ull;

LockState alive(uint32_t) {
  return LockState::kHeld;
}
LockState dead(uint32_t) {
  return LockState::kFree;
}

class ClaimTableTest : public ::testing::Test {
 protected:
  ClaimTableTest() : memory_(claim_table_bytes(kBlocks) / 8 + 1) {
    initialize_claim_table(region());
    owner_ = std::make_unique<ClaimOwner>(region(), kBlocks);
  }
  std::span<std::byte> region() {
    return {reinterpret_cast<std::byte*>(memory_.data()), claim_table_bytes(kBlocks)};
  }
  ClaimWriterView writer(uint32_t slot) { return ClaimWriterView(region(), kBlocks, slot); }

  std::vector<uint64_t> memory_;  // 8-byte aligned
  std::unique_ptr<ClaimOwner> owner_;
};

TEST_F(ClaimTableTest, AWriterSeesAnOpenClaimAndWhichBlocksItHolds) {
  const std::vector<uint32_t> blocks = {3, 4, 9};
  ASSERT_TRUE(owner_->open(77, blocks, 10));
  ClaimWriterView w = writer(0);
  const ClaimLookup l = w.lookup(77, 20);
  EXPECT_EQ(l.state, ClaimState::kOpen);
  for (uint32_t b : blocks)
    EXPECT_EQ(w.claim_of(b), l.entry + 1) << b;
  EXPECT_EQ(w.claim_of(5), 0u);
  EXPECT_EQ(w.claim_of(kBlocks + 5), 0u) << "out of range reads as unclaimed";
  EXPECT_EQ(w.lookup(78, 20).state, ClaimState::kFree);
}

TEST_F(ClaimTableTest, ClaimsOfTakenBlocksBlocksOutOfRangeAndRepeatedKeysAreRefused) {
  ASSERT_TRUE(owner_->open(1, std::vector<uint32_t>{1, 2}, 10));
  EXPECT_EQ(owner_->open(2, std::vector<uint32_t>{2, 3}, 10).error().message,
            "block 2 is claimed already");
  EXPECT_EQ(owner_->open(3, std::vector<uint32_t>{kBlocks}, 10).error().message,
            "block 64 is outside the pool's 64 blocks");
  EXPECT_EQ(owner_->open(1, std::vector<uint32_t>{7}, 10).error().message,
            "the key holds a claim already");
  EXPECT_EQ(writer(0).claim_of(3), 0u) << "a refused claim leaves nothing behind";
  EXPECT_EQ(owner_->open_claims(), 1u);
}

TEST_F(ClaimTableTest, AClosedKeyIsRefusedForAMinuteAndItsBlocksAreFreeAtOnce) {
  ASSERT_TRUE(owner_->open(5, std::vector<uint32_t>{10, 11}, 10));
  const uint64_t before = owner_->epoch();
  const uint64_t epoch = owner_->close(5, 100);
  EXPECT_EQ(epoch, before + 1);
  EXPECT_EQ(owner_->close(5, 100), 0u) << "a second close has nothing to close";
  ClaimWriterView w = writer(0);
  EXPECT_EQ(w.claim_of(10), 0u);
  EXPECT_EQ(w.lookup(5, 100 + 59 * kSecond).state, ClaimState::kClosed);
  EXPECT_EQ(w.lookup(5, 100 + 61 * kSecond).state, ClaimState::kFree);
  // Another key may claim the blocks at once; the same key may claim again.
  ASSERT_TRUE(owner_->open(6, std::vector<uint32_t>{10}, 200));
  ASSERT_TRUE(owner_->open(5, std::vector<uint32_t>{11}, 200));
  EXPECT_EQ(w.lookup(5, 300).state, ClaimState::kOpen);
}

// A writer takes its clock, then looks; the owner may close the key in
// between, stamping a later time. That close is a moment ago, not a minute.
TEST_F(ClaimTableTest, AKeyClosedAfterTheWriterReadItsClockReadsClosed) {
  ASSERT_TRUE(owner_->open(5, std::vector<uint32_t>{10, 11}, 10));
  ASSERT_NE(owner_->close(5, 1000), 0u);
  EXPECT_EQ(writer(0).lookup(5, 999).state, ClaimState::kClosed);
  EXPECT_EQ(writer(0).lookup(5, 1000).state, ClaimState::kClosed);
}

TEST_F(ClaimTableTest, ACloseWaitsForAWriterThatAnnouncedBeforeItAndNotForOneAfter) {
  ASSERT_TRUE(owner_->open(9, std::vector<uint32_t>{1}, 10));
  ClaimWriterView early = writer(3);
  const uint64_t early_epoch = early.announce(0);
  ASSERT_EQ(early.lookup(9, 20).state, ClaimState::kOpen);  // it admitted a write
  const uint64_t closed = owner_->close(9, 30);
  EXPECT_FALSE(owner_->quiescent(closed, alive));
  EXPECT_TRUE(owner_->quiescent(closed, dead)) << "a dead writer holds nothing up";
  ClaimWriterView late = writer(4);
  late.announce(0);
  EXPECT_EQ(late.lookup(9, 40).state, ClaimState::kClosed) << "a later writer sees the close";
  early.set_announcement(early_epoch);  // still writing
  EXPECT_FALSE(owner_->quiescent(closed, alive));
  early.set_announcement(0);  // done
  EXPECT_TRUE(owner_->quiescent(closed, alive)) << "the later writer does not hold it up";
}

TEST_F(ClaimTableTest, AnOlderAnnouncementStandsWhileTheWritesBehindItGoOn) {
  ASSERT_TRUE(owner_->open(9, std::vector<uint32_t>{1}, 10));
  ClaimWriterView w = writer(0);
  const uint64_t first = w.announce(0);
  const uint64_t closed = owner_->close(9, 20);
  const uint64_t second = w.announce(first);  // a second write while the first is in flight
  EXPECT_GT(second, first);
  EXPECT_FALSE(owner_->quiescent(closed, alive));
  w.set_announcement(second);  // the first is done: the second read the new epoch
  EXPECT_TRUE(owner_->quiescent(closed, alive));
}

TEST_F(ClaimTableTest, AFullProbeWindowIsRefusedAndTheOldestClosedEntryIsReused) {
  // Keys that share a home place (the hash spreads keys, so search).
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; keys.size() < kClaimProbe + 1; ++k)
    if (claim_home(k) == claim_home(1)) keys.push_back(k);
  ClaimWriterView w = writer(0);
  for (uint32_t i = 0; i < kClaimProbe; ++i)
    ASSERT_TRUE(owner_->open(keys[i], std::vector<uint32_t>{}, 100 + i)) << i;
  EXPECT_EQ(owner_->open(keys[kClaimProbe], std::vector<uint32_t>{}, 200).code(), Errc::kFull);
  owner_->close(keys[2], 300);
  owner_->close(keys[1], 400);
  ASSERT_TRUE(owner_->open(keys[kClaimProbe], std::vector<uint32_t>{}, 500));
  EXPECT_EQ(w.lookup(keys[2], 500).state, ClaimState::kFree) << "the oldest closed was reused";
  EXPECT_EQ(w.lookup(keys[1], 500).state, ClaimState::kClosed);
}

TEST_F(ClaimTableTest, AResetForgetsEveryClaimAndTheEpochGoesOn) {
  ASSERT_TRUE(owner_->open(1, std::vector<uint32_t>{1, 2}, 10));
  const uint64_t before = owner_->epoch();
  owner_->reset();
  EXPECT_GT(owner_->epoch(), before);
  EXPECT_EQ(writer(0).lookup(1, 20).state, ClaimState::kFree);
  EXPECT_EQ(writer(0).claim_of(1), 0u);
  EXPECT_TRUE(owner_->open(2, std::vector<uint32_t>{1, 2}, 30));
}

}  // namespace
}  // namespace kvrelay
