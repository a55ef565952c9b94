// The pages a process page-locks for a GPU (kernels/pin_registry.h), with
// the registering counted instead of done by CUDA: the 16 ranks' device
// signal words share one page, so two ranks' writers in one process must pin
// it once and unpin it with the last of them (CUDA refuses a second
// registration of a page).
#include "kernels/pin_registry.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvrelay::kernels {
namespace {

constexpr uintptr_t kPage = 4096;

class PinRegistryTest : public ::testing::Test {
 protected:
  PinRegistry registry_{[this](PinRegistry::Pages& p) -> Status {
                          if (refuse_) return make_error(Errc::kSystem, "cudaHostRegister: no");
                          registered_.push_back(p.start);
                          if (p.mapped) p.device_base = 0x7000'0000'0000 + p.start;
                          return {};
                        },
                        [this](const PinRegistry::Pages& p) { unregistered_.push_back(p.start); }};
  bool refuse_ = false;
  std::vector<uintptr_t> registered_, unregistered_;
};

TEST_F(PinRegistryTest, TwoRanksSignalWordsOnOnePagePinItOnceAndTheLastUnpinsIt) {
  // Rank 0's and rank 1's words: the same page, each pinned mapped.
  auto rank0 = registry_.pin(10 * kPage, 11 * kPage, true, 0);
  auto rank1 = registry_.pin(10 * kPage, 11 * kPage, true, 1);
  ASSERT_TRUE(rank0 && rank1) << (rank0 ? rank1.error().message : rank0.error().message);
  EXPECT_EQ(registered_.size(), 1U) << "CUDA registers a page once per process";
  EXPECT_EQ(rank1->device_base, rank0->device_base) << "both write through one mapping";
  EXPECT_EQ(registry_.users(), 2U);
  registry_.release(rank0->start);
  EXPECT_TRUE(unregistered_.empty()) << "rank 1 still writes there";
  registry_.release(rank1->start);
  EXPECT_EQ(unregistered_, std::vector<uintptr_t>{10 * kPage});
  EXPECT_EQ(registry_.ranges(), 0U);
}

TEST_F(PinRegistryTest, ARangeInsideAPinnedOneSharesItsMapping) {
  auto pool = registry_.pin(0, 16 * kPage, true, 0);
  auto word = registry_.pin(3 * kPage, 4 * kPage, true, 0);
  ASSERT_TRUE(pool && word);
  EXPECT_EQ(word->start, 0U) << "the pinned range that holds it";
  EXPECT_EQ(word->device_base, pool->device_base);
  EXPECT_EQ(registered_.size(), 1U);
  // Unmapped inside mapped is fine too.
  EXPECT_TRUE(registry_.pin(5 * kPage, 6 * kPage, false, 0));
  EXPECT_EQ(registry_.users(), 3U);
}

TEST_F(PinRegistryTest, AnOverlapThatCudaCouldNotRegisterIsRefusedNamingBothRanges) {
  ASSERT_TRUE(registry_.pin(4 * kPage, 8 * kPage, false, 0));
  for (auto [start, end] : {std::pair{2 * kPage, 5 * kPage}, std::pair{7 * kPage, 9 * kPage},
                            std::pair{2 * kPage, 9 * kPage}}) {
    auto r = registry_.pin(start, end, false, 0);
    ASSERT_FALSE(r) << start << ".." << end;
    EXPECT_NE(r.error().message.find("overlap pages [0x4000, 0x8000)"), std::string::npos)
        << r.error().message;
  }
  auto needs_mapping = registry_.pin(5 * kPage, 6 * kPage, true, 0);
  ASSERT_FALSE(needs_mapping) << "the pinned range has no device mapping";
  EXPECT_NE(needs_mapping.error().message.find("without one"), std::string::npos);
  EXPECT_EQ(registered_.size(), 1U);
  EXPECT_EQ(registry_.users(), 1U) << "a refusal counts no user";
}

TEST_F(PinRegistryTest, NeighbouringRangesArePinnedApart) {
  ASSERT_TRUE(registry_.pin(0, kPage, false, 0));
  ASSERT_TRUE(registry_.pin(kPage, 2 * kPage, false, 0));
  EXPECT_EQ(registered_.size(), 2U);
  EXPECT_EQ(registry_.ranges(), 2U);
}

TEST_F(PinRegistryTest, AFailedRegistrationLeavesNothingBehind) {
  refuse_ = true;
  auto r = registry_.pin(0, kPage, true, 0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "cudaHostRegister: no");
  EXPECT_EQ(registry_.ranges(), 0U);
  refuse_ = false;
  EXPECT_TRUE(registry_.pin(0, kPage, true, 0)) << "and a later pin registers afresh";
}

}  // namespace
}  // namespace kvrelay::kernels
