// Heterogeneous TP across real processes: what is refused, and how. The
// byte-for-byte transfers are in transfer_test.cpp (HeteroTpDifferential)
// and the ctest sim.hetero_tp.* runs.
#include <gtest/gtest.h>

#include "integration/two_instances.h"

namespace kvrelay::testing {
namespace {

using namespace std::chrono_literals;

InstanceArgs prefill_args(uint32_t tp, uint32_t kv_heads) {
  InstanceArgs a;
  a.tp = tp;
  a.kv_heads = kv_heads;
  a.layers = 2;
  a.blocks = 32;
  return a;
}

// Sends one request of two blocks through both layers; returns its completion.
Completion one_request(TwoInstances& env, const std::string& id) {
  const sim::RequestBlocks r{1, {0, 1}, {2, 3}};
  EXPECT_TRUE(env.submit_task(id, r, 32, 0).ok());
  EXPECT_TRUE(env.submit_dest(id, r).ok());
  env.prefill_step(1, {{0, 0, 32, Client::request_tag(id)}}, 2);
  return env.wait_for(id);
}

TEST(HeteroTp, AnotherModelsHeadCountIsRefusedNamingBothSides) {
  // 2 x 2 heads against 4 x 2: not the same model.
  Placement where;
  where.decode_tp = 4;
  where.decode_kv_heads = 2;
  TwoInstances env("hetmodel", prefill_args(2, 2), where);
  const Completion c = one_request(env, "other-model");
  EXPECT_EQ(c.status, CompletionStatus::kError);
  EXPECT_NE(c.message.find("has 8 KV heads in all (tp 4, 2 per rank), this instance 4 (tp 2, 2 "
                           "per rank)"),
            std::string::npos)
      << c.message;
  env.stop_and_check_clean();
}

// A K-only (MLA latent) pool never pairs with a K+V pool: refused at the
// handshake, naming the kind of both sides, whatever else differs.
TEST(HeteroTp, AKOnlyPoolAgainstAKAndVPoolIsRefusedNamingBothKinds) {
  Placement same_heads;
  same_heads.prefill_extra = {"--k-only"};
  TwoInstances env("hetkind", prefill_args(2, 1), same_heads);
  Completion c = one_request(env, "k-only-to-kv");
  EXPECT_EQ(c.status, CompletionStatus::kError);
  EXPECT_NE(c.message.find("pools differ in kind: K only (an MLA latent cache) here, K and V at "
                           "the peer"),
            std::string::npos)
      << c.message;
  env.stop_and_check_clean();

  // An MLA cache (one head in all, replicated) against a GQA one (four).
  Placement gqa;
  gqa.decode_extra = {"--total-kv-heads", "4"};
  gqa.decode_kv_heads = 2;
  gqa.prefill_extra = {"--k-only", "--total-kv-heads", "1"};
  TwoInstances mla("hetmla", prefill_args(2, 1), gqa);
  c = one_request(mla, "mla-to-gqa");
  EXPECT_EQ(c.status, CompletionStatus::kError);
  EXPECT_NE(c.message.find("pools differ in kind"), std::string::npos) << c.message;
  mla.stop_and_check_clean();
}

TEST(HeteroTp, AnotherBlockShapeIsRefusedNamingTheFieldAndBothValues) {
  Placement where;
  where.decode_tp = 1;
  where.decode_kv_heads = 4;
  where.decode_head_dim = 64;  // 32 on the prefill side
  TwoInstances env("hetshape", prefill_args(2, 2), where);
  const Completion c = one_request(env, "other-shape");
  EXPECT_EQ(c.status, CompletionStatus::kError);
  EXPECT_NE(c.message.find("pools differ in head_dim: 32 here, 64 at the peer"),
            std::string::npos)
      << c.message;
  env.stop_and_check_clean();
}

TEST(HeteroTp, TwoToFourMovesEveryHeadAndNothingElse) {
  Placement where;
  where.decode_tp = 4;
  where.decode_kv_heads = 1;
  TwoInstances env("het24", prefill_args(2, 2), where);
  const sim::RequestBlocks r{7, {4, 5, 6}, {9, 10}};  // one block of prefix cache
  for (uint32_t rank = 0; rank < 2; ++rank)
    sim::fill_request_heads(env.src_pool(rank), env.src_first_head(rank), r);
  for (uint32_t rank = 0; rank < 4; ++rank)
    for (uint32_t l = 0; l < 2; ++l)
      for (uint32_t t = 0; t < 2; ++t)
        for (uint32_t b = 0; b < 32; ++b) sim::poison_block(env.dst_pool(rank), l, t, b);
  ASSERT_TRUE(env.submit_task("h", r, 48, 0).ok());
  ASSERT_TRUE(env.submit_dest("h", r).ok());
  env.prefill_step(1, {{0, 0, 48, Client::request_tag("h")}}, 2);
  const Completion c = env.wait_for("h");
  ASSERT_EQ(c.status, CompletionStatus::kFinished) << c.message;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(sim::check_request_heads(env.dst_pool(rank), env.dst_first_head(rank), r), 0u)
        << "decode rank " << rank;
    for (uint32_t l = 0; l < 2; ++l)
      for (uint32_t t = 0; t < 2; ++t)
        for (uint32_t b = 0; b < 32; ++b)
          if (b != 9 && b != 10) {
            EXPECT_TRUE(sim::block_is_poisoned(env.dst_pool(rank), l, t, b))
                << "decode rank " << rank << " block " << b << " was written";
          }
  }
  // Each head once to each rank that holds it: 2 blocks x 2 layers x 2
  // tensors x 4 ranks x one head.
  EXPECT_EQ(c.bytes_moved, 2u * 2 * 2 * 4 * env.dst_pool(0).geometry().block_bytes(PoolTensor::kKey));
  env.stop_and_check_clean();
}

}  // namespace
}  // namespace kvrelay::testing
