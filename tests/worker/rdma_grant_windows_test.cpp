// The sender's lookup of the key a grant gave for each write: a write gets
// the key of the run that holds it whole, and none where no run does (a
// grant that does not cover a write ends the session, never a guess).
#include <gtest/gtest.h>

#include <vector>

#include "worker/rdma/grant_windows.h"

namespace kvrelay::worker::rdma {
namespace {

TEST(GrantWindows, EachWriteGetsTheKeyOfTheRunThatHoldsItWhole) {
  // Runs (by destination block) 7..8, 0, 3..5, in the intent's order; two
  // tensors, keys 10 + run for the first and 20 + run for the second.
  const std::vector<BlockRun> runs = {{0, 7, 2}, {2, 0, 1}, {3, 3, 3}};
  const std::vector<uint32_t> rkeys = {10, 20, 11, 21, 12, 22};
  constexpr uint64_t kBlock = 100;
  std::vector<GrantWindow> windows;
  windows_of(runs, rkeys, /*slot=*/1, /*tensors=*/2, kBlock, windows);
  ASSERT_EQ(windows.size(), 3u);
  EXPECT_EQ(windows[0].begin, 0u);
  EXPECT_EQ(windows[0].rkey, 21u);
  EXPECT_EQ(windows[2].end, 900u);

  EXPECT_EQ(key_for(windows, 0, 100), std::optional<uint32_t>(21));
  EXPECT_EQ(key_for(windows, 300, 300), std::optional<uint32_t>(22)) << "a whole run";
  EXPECT_EQ(key_for(windows, 750, 150), std::optional<uint32_t>(20)) << "a run's tail";
  EXPECT_EQ(key_for(windows, 100, 1), std::nullopt) << "block 1 is in no run";
  EXPECT_EQ(key_for(windows, 500, 200), std::nullopt) << "past run 3..5 into block 6";
  EXPECT_EQ(key_for(windows, 850, 100), std::nullopt) << "past the last run";
  EXPECT_EQ(key_for(windows, 900, 0), std::nullopt) << "at the end of the last run";
  EXPECT_EQ(key_for(windows, 899, UINT64_MAX), std::nullopt) << "a length that would wrap";

  windows_of(runs, rkeys, /*slot=*/0, /*tensors=*/2, kBlock, windows);
  EXPECT_EQ(key_for(windows, 0, 100), std::optional<uint32_t>(11));
  windows_of({}, {}, 0, 2, kBlock, windows);
  EXPECT_EQ(key_for(windows, 0, 1), std::nullopt) << "no runs, no keys";
}

}  // namespace
}  // namespace kvrelay::worker::rdma
