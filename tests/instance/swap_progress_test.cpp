// Swap-progress slots: a rank that never confirmed a withdrawn load cannot
// move the counter of the load that holds its slot next, and a reader never
// mixes two loads.
#include "instance/swap_progress.h"

#include <gtest/gtest.h>

#include <memory>

namespace kvrelay {
namespace {

TEST(SwapProgress, AStaleRanksPublishIntoAReassignedSlotIsIgnored) {
  auto table = std::make_unique<SwapProgressTable>();
  uint32_t first_generation = 0;
  const uint32_t slot = swap_progress::begin(*table, 10, 0xAAAA, 0, 8, first_generation);
  ASSERT_NE(slot, kNoProgressSlot);
  swap_progress::publish(*table, slot, first_generation, 0, 3);
  auto old_view = swap_progress::find(*table, 0xAAAA);
  ASSERT_TRUE(old_view.has_value());
  EXPECT_EQ(swap_progress::layers_done(*table, *old_view, 0), 3u);
  // The load is withdrawn; rank 1 never confirmed. The slot goes to a new load.
  swap_progress::end(*table, slot, false);
  std::vector<uint32_t> taken;  // fill every free slot, so the ended one is reused
  uint32_t generation = 0;
  for (uint32_t i = 0; i + 1 < kSwapProgressSlots; ++i)
    taken.push_back(swap_progress::begin(*table, 100 + i, 0xB000 + i, 0, 8, generation));
  const uint32_t again = swap_progress::begin(*table, 5000, 0xCCCC, 0, 8, generation);
  ASSERT_EQ(again, slot) << "the ended slot is the one reassigned";
  EXPECT_NE(generation, first_generation);
  // The stale rank publishes 8 layers for its old load: nothing changes.
  swap_progress::publish(*table, slot, first_generation, 1, 8);
  auto fresh = swap_progress::find(*table, 0xCCCC);
  ASSERT_TRUE(fresh.has_value());
  EXPECT_EQ(swap_progress::layers_done(*table, *fresh, 1), 0u);
  // A reader still holding the old load's view learns it moved on.
  EXPECT_FALSE(swap_progress::layers_done(*table, *old_view, 0).has_value());
  // The new load's own rank counts.
  swap_progress::publish(*table, slot, generation, 1, 2);
  EXPECT_EQ(swap_progress::layers_done(*table, *fresh, 1), 2u);
}

TEST(SwapProgress, CountsOnlyGrow) {
  auto table = std::make_unique<SwapProgressTable>();
  uint32_t generation = 0;
  const uint32_t slot = swap_progress::begin(*table, 1, 7, 0, 8, generation);
  swap_progress::publish(*table, slot, generation, 0, 5);
  swap_progress::publish(*table, slot, generation, 0, 2);
  auto v = swap_progress::find(*table, 7);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(swap_progress::layers_done(*table, *v, 0), 5u);
}

}  // namespace
}  // namespace kvrelay
