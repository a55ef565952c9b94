// The sender's lookup of the key a grant gave for each write: a write gets
// the key of the run that holds it whole, and none where no run does (a
// grant that does not cover a write ends the session, never a guess).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "worker/rdma/grant_windows.h"

namespace kvrelay::worker::rdma {
namespace {

// Runs (by destination block) 7..8, 0, 3..5, in the intent's order; two
// tensors, keys 10 + run for the first and 20 + run for the second.
const std::vector<BlockRun> kRuns = {{0, 7, 2}, {2, 0, 1}, {3, 3, 3}};
const std::vector<uint32_t> kKeys = {10, 20, 11, 21, 12, 22};
constexpr uint64_t kBlock = 100;

TEST(GrantWindows, EachWriteGetsTheKeyOfTheRunThatHoldsItWhole) {
  GrantedRunKeys keys(kRuns, kKeys, /*slot=*/1, /*tensors=*/2, kBlock);
  EXPECT_EQ(keys.next(700, 100), std::optional<uint32_t>(20)) << "a run's head";
  EXPECT_EQ(keys.next(750, 150), std::optional<uint32_t>(20)) << "a run's tail";
  EXPECT_EQ(keys.next(0, 100), std::optional<uint32_t>(21)) << "the next run";
  EXPECT_EQ(keys.next(300, 300), std::optional<uint32_t>(22)) << "a whole run";
  EXPECT_EQ(keys.next(100, 1), std::nullopt) << "block 1 is in no run";
  EXPECT_EQ(keys.next(500, 200), std::nullopt) << "past run 3..5 into block 6";
  EXPECT_EQ(keys.next(850, 100), std::nullopt) << "past the last run";
  EXPECT_EQ(keys.next(600, 0), std::nullopt) << "at the end of the last run";
  EXPECT_EQ(keys.next(599, UINT64_MAX), std::nullopt) << "a length that would wrap";
  EXPECT_EQ(keys.next(700, 100), std::nullopt) << "an earlier run: writes come in run order";
  EXPECT_EQ(keys.next(300, 100), std::optional<uint32_t>(22)) << "a miss moves nothing";

  GrantedRunKeys first(kRuns, kKeys, /*slot=*/0, /*tensors=*/2, kBlock);
  EXPECT_EQ(first.next(700, 200), std::optional<uint32_t>(10));
  EXPECT_EQ(first.next(0, 100), std::optional<uint32_t>(11));
  GrantedRunKeys none({}, {}, 0, 2, kBlock);
  EXPECT_EQ(none.next(0, 1), std::nullopt) << "no runs, no keys";
}

// A run split into several writes (heterogeneous TP's head ranges, or a run
// longer than a work request) keeps its key for each of them.
TEST(GrantWindows, EveryWriteOfARunGetsItsKey) {
  GrantedRunKeys keys(kRuns, kKeys, /*slot=*/1, /*tensors=*/2, kBlock);
  for (uint64_t block = 7; block < 9; ++block)
    EXPECT_EQ(keys.next(block * kBlock + 40, 20), std::optional<uint32_t>(20)) << block;
  EXPECT_EQ(keys.next(40, 20), std::optional<uint32_t>(21));
  for (uint64_t block = 3; block < 6; ++block)
    EXPECT_EQ(keys.next(block * kBlock + 40, 20), std::optional<uint32_t>(22)) << block;
}

}  // namespace
}  // namespace kvrelay::worker::rdma
