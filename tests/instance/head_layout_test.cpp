// The head split of heterogeneous TP (instance/head_layout.h): which heads
// each prefill rank sends to which decode rank. Checked case by case, and
// against a brute-force model of what the ranks hold over random layouts.
#include "instance/head_layout.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <tuple>

namespace kvrelay {
namespace {

HeadLayout layout(uint32_t tp, uint32_t total) {
  return HeadLayout{tp, total >= tp ? total / tp : 1, total};
}

TEST(HeadLayout, SameLayoutsSendEveryHeadToTheSameRank) {
  for (const HeadLayout l : {layout(2, 8), layout(4, 4), layout(8, 2)}) {
    for (uint32_t r = 0; r < l.tp_size; ++r) {
      const std::vector<HeadShare> shares = head_shares(l, r, l);
      ASSERT_EQ(shares.size(), 1u);
      EXPECT_EQ(shares[0], (HeadShare{r, 0, 0, l.heads_per_rank}));
    }
  }
}

TEST(HeadLayout, TwoToFourSplitsEachPrefillRankOverTwoDecodeRanks) {
  const HeadLayout p = layout(2, 8), d = layout(4, 8);
  EXPECT_EQ(head_shares(p, 0, d), (std::vector<HeadShare>{{0, 0, 0, 2}, {1, 2, 0, 2}}));
  EXPECT_EQ(head_shares(p, 1, d), (std::vector<HeadShare>{{2, 0, 0, 2}, {3, 2, 0, 2}}));
  for (uint32_t r = 0; r < 4; ++r) EXPECT_EQ(senders_of(p, d, r), 1u);
}

TEST(HeadLayout, FourToTwoFillsEachDecodeRankFromTwoPrefillRanks) {
  const HeadLayout p = layout(4, 8), d = layout(2, 8);
  EXPECT_EQ(head_shares(p, 1, d), (std::vector<HeadShare>{{0, 0, 2, 2}}));
  EXPECT_EQ(head_shares(p, 2, d), (std::vector<HeadShare>{{1, 0, 0, 2}}));
  EXPECT_EQ(senders_of(p, d, 0), 2u);
}

TEST(HeadLayout, ReplicatedDecodeHeadsReachEveryReplica) {
  // 2 KV heads, decode tp 4: ranks 0 and 1 hold head 0, ranks 2 and 3 head 1.
  const HeadLayout p = layout(1, 2), d = layout(4, 2);
  EXPECT_EQ(head_shares(p, 0, d),
            (std::vector<HeadShare>{{0, 0, 0, 1}, {1, 0, 0, 1}, {2, 1, 0, 1}, {3, 1, 0, 1}}));
}

TEST(HeadLayout, ReplicatedPrefillHeadsAreSentOnceSpreadOverTheReplicas) {
  // 2 KV heads, prefill tp 4 (ranks 0, 1 hold head 0; 2, 3 head 1), decode tp 8.
  const HeadLayout p = layout(4, 2), d = layout(8, 2);
  EXPECT_EQ(head_shares(p, 0, d), (std::vector<HeadShare>{{0, 0, 0, 1}, {2, 0, 0, 1}}));
  EXPECT_EQ(head_shares(p, 1, d), (std::vector<HeadShare>{{1, 0, 0, 1}, {3, 0, 0, 1}}));
  // Decode tp 1 holds both heads: one replica of each sends, the others nothing.
  const HeadLayout one = layout(1, 2);
  EXPECT_EQ(head_shares(p, 0, one), (std::vector<HeadShare>{{0, 0, 0, 1}}));
  EXPECT_TRUE(head_shares(p, 1, one).empty());
  EXPECT_EQ(head_shares(p, 2, one), (std::vector<HeadShare>{{0, 0, 1, 1}}));
  EXPECT_EQ(senders_of(p, one, 0), 2u);
}

TEST(HeadLayout, LayoutsThatSpreadNoHeadsAreRefusedNamingTheNumbers) {
  EXPECT_TRUE(layout(4, 8).check());
  EXPECT_TRUE(layout(16, 8).check());
  const Status uneven = HeadLayout{3, 2, 8}.check();
  ASSERT_FALSE(uneven);
  EXPECT_NE(uneven.error().message.find("8 KV heads in all cannot be spread over tp 3 with 2"),
            std::string::npos)
      << uneven.error().message;
  EXPECT_FALSE((HeadLayout{16, 2, 8}.check())) << "replicated heads hold one head per rank";
  EXPECT_FALSE((HeadLayout{12, 1, 8}.check())) << "12 ranks cannot replicate 8 heads evenly";
  EXPECT_FALSE((HeadLayout{0, 1, 1}.check()));
}

TEST(HeadLayout, TheInstanceLayoutDefaultsToKvHeadsTimesTp) {
  InstanceConfig c = default_config("x", 4);
  c.kv_heads = 2;
  EXPECT_EQ(head_layout_of(c), (HeadLayout{4, 2, 8}));
  c.kv_heads = 1;
  c.total_kv_heads = 2;
  EXPECT_EQ(head_layout_of(c), (HeadLayout{4, 1, 2}));
  EXPECT_TRUE(validate_config(c));
  c.total_kv_heads = 3;
  const Status bad = validate_config(c);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("total_kv_heads 3"), std::string::npos)
      << bad.error().message;
}

// The model the split must agree with, from first principles: which model
// heads a rank holds.
std::vector<uint32_t> heads_held(const HeadLayout& l, uint32_t rank) {
  std::vector<uint32_t> held;
  for (uint32_t h = 0; h < l.total_heads; ++h) {
    const bool holds = l.tp_size <= l.total_heads
                           ? h / (l.total_heads / l.tp_size) == rank
                           : rank * l.total_heads / l.tp_size == h;
    if (holds) held.push_back(h);
  }
  return held;
}

TEST(HeadLayout, RandomLayoutsDeliverEveryHeadOfEveryDecodeRankExactlyOnce) {
  std::mt19937 rng(20261201);
  const uint32_t sizes[] = {1, 2, 4, 8, 16};
  const uint32_t totals[] = {1, 2, 4, 8, 16, 32, 64};
  for (int round = 0; round < 2000; ++round) {
    const uint32_t total = totals[rng() % std::size(totals)];
    const HeadLayout p = layout(sizes[rng() % std::size(sizes)], total);
    const HeadLayout d = layout(sizes[rng() % std::size(sizes)], total);
    ASSERT_TRUE(p.check());
    ASSERT_TRUE(d.check());
    SCOPED_TRACE(::testing::Message() << "prefill tp " << p.tp_size << ", decode tp " << d.tp_size
                                      << ", " << total << " heads");
    // (decode rank, its head index) -> times delivered
    std::map<std::pair<uint32_t, uint32_t>, int> delivered;
    std::map<uint32_t, std::vector<uint32_t>> senders;  // decode rank -> prefill ranks
    for (uint32_t pr = 0; pr < p.tp_size; ++pr) {
      const std::vector<uint32_t> mine = heads_held(p, pr);
      ASSERT_EQ(mine.size(), p.heads_per_rank);
      const std::vector<HeadShare> shares = head_shares(p, pr, d);
      for (size_t i = 0; i < shares.size(); ++i) {
        const HeadShare& s = shares[i];
        ASSERT_LT(s.decode_rank, d.tp_size);
        ASSERT_GT(s.heads, 0u);
        ASSERT_LE(s.src_head + s.heads, p.heads_per_rank);
        ASSERT_LE(s.dst_head + s.heads, d.heads_per_rank);
        const std::vector<uint32_t> theirs = heads_held(d, s.decode_rank);
        for (uint32_t k = 0; k < s.heads; ++k)
          ASSERT_EQ(mine[s.src_head + k], theirs[s.dst_head + k]) << "a head lands as another";
        for (uint32_t k = 0; k < s.heads; ++k) ++delivered[{s.decode_rank, s.dst_head + k}];
        senders[s.decode_rank].push_back(pr);
        if (i > 0 && shares[i - 1].decode_rank == s.decode_rank) {
          const HeadShare& prev = shares[i - 1];
          EXPECT_FALSE(prev.src_head + prev.heads == s.src_head &&
                       prev.dst_head + prev.heads == s.dst_head)
              << "adjacent ranges left unmerged";
        }
      }
    }
    for (uint32_t dr = 0; dr < d.tp_size; ++dr) {
      for (uint32_t k = 0; k < d.heads_per_rank; ++k)
        ASSERT_EQ((delivered[{dr, k}]), 1) << "decode rank " << dr << " head " << k;
      std::vector<uint32_t> ranks = senders[dr];
      std::sort(ranks.begin(), ranks.end());
      ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
      EXPECT_EQ(ranks.size(), senders_of(p, d, dr));
    }
  }
}

}  // namespace
}  // namespace kvrelay
