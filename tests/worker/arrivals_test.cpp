// The decode side's expected requests: a request arrives exactly when every
// block of every layer and tensor has landed, once; nobody writes into
// another request's declared blocks; late frames are refused.
#include "worker/arrivals.h"

#include <gtest/gtest.h>

namespace kvrelay::worker {
namespace {

PoolGeometry geometry() {
  PoolGeometry g;
  g.num_layers = 2;
  g.num_blocks = 16;
  g.kv_heads = 1;
  g.block_size = 4;
  g.head_dim = 8;
  g.dtype = static_cast<uint32_t>(CacheDtype::kBf16);
  return g;
}

constexpr uint64_t kBlock = 4 * 8 * 2;

LandedWrite frame(const std::string& id, uint32_t layer, uint32_t tensor, uint32_t block,
                  uint32_t count = 1) {
  LandedWrite f;
  f.request_key = request_key(id);
  f.layer = layer;
  f.tensor = tensor;
  f.dst_offset = block * kBlock;
  f.bytes = count * kBlock;
  return f;
}

// Admits and lands a frame, as the receiver does.
Status deliver(Arrivals& a, const LandedWrite& f) {
  Status s = a.admit(f);
  if (s) a.landed(f);
  return s;
}

TEST(Arrivals, ARequestArrivesOnceWhenEveryLayerAndTensorOfEveryBlockHasLanded) {
  Arrivals a(geometry(), nullptr);
  ASSERT_TRUE(a.expect(7, "r1", {3, 4, 9}));
  for (uint32_t l = 0; l < 2; ++l)
    for (uint32_t t = 0; t < 2; ++t) {
      ASSERT_TRUE(deliver(a, frame("r1", l, t, 3, 2)));  // blocks 3 and 4 in one run
      if (l == 1 && t == 1) {
        EXPECT_FALSE(a.any()) << "block 9 of layer 1, V is still missing";
        ASSERT_TRUE(deliver(a, frame("r1", l, t, 3, 2))) << "a repeat counts once";
        EXPECT_FALSE(a.any());
      }
      ASSERT_TRUE(deliver(a, frame("r1", l, t, 9)));
    }
  auto events = a.take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].handle, 7u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kArrived);
  EXPECT_EQ(events[0].bytes, 3 * 2 * 2 * kBlock);
  EXPECT_FALSE(deliver(a, frame("r1", 0, 0, 3))) << "a late frame of an arrived request";
}

TEST(Arrivals, NoFrameWritesIntoBlocksAnotherRequestDeclared) {
  Arrivals a(geometry(), nullptr);
  ASSERT_TRUE(a.expect(1, "mine", {5}));
  Status foreign = deliver(a, frame("other", 0, 0, 5));
  ASSERT_FALSE(foreign);
  EXPECT_EQ(foreign.error().message,
            "a write goes to destination block 5, which request 'mine' declared");
  EXPECT_TRUE(deliver(a, frame("other", 0, 0, 6))) << "undeclared blocks: the shape check only";
  EXPECT_FALSE(a.any()) << "'mine' is unaffected";
  EXPECT_FALSE(a.expect(2, "second", {5})) << "a block is declared by one request at a time";
}

TEST(Arrivals, ADeclaredRequestWritingOutsideItsBlocksFails) {
  Arrivals a(geometry(), nullptr);
  ASSERT_TRUE(a.expect(3, "r", {1, 2}));
  Status s = deliver(a, frame("r", 0, 0, 2, 2));  // blocks 2 and 3
  ASSERT_FALSE(s);
  auto events = a.take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kFailed);
  EXPECT_EQ(events[0].message,
            "a write of request 'r' goes to destination block 3, which it did not declare");
  EXPECT_TRUE(a.expect(4, "next", {1, 2})) << "its blocks are free again";
}

TEST(Arrivals, AWithdrawalIsAnsweredOnlyOnceThePayloadsBeingWrittenHaveLanded) {
  Arrivals a(geometry(), nullptr);
  ASSERT_TRUE(a.expect(9, "r", {0}));
  const LandedWrite f = frame("r", 0, 0, 0);
  ASSERT_TRUE(a.admit(f));  // its payload is being read into the pool
  EXPECT_TRUE(a.withdraw(9));
  EXPECT_FALSE(a.any()) << "not while a payload of it is still being written";
  EXPECT_FALSE(a.admit(frame("r", 1, 0, 0))) << "no new frame of it";
  a.landed(f);
  auto events = a.take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kWithdrawn);
  EXPECT_FALSE(a.withdraw(9)) << "once";
  EXPECT_FALSE(deliver(a, frame("r", 0, 1, 0))) << "and its frames stay refused";
}

TEST(Arrivals, APayloadCutOffByAClosedConnectionNoLongerHoldsUpAWithdrawal) {
  Arrivals a(geometry(), nullptr);
  ASSERT_TRUE(a.expect(9, "r", {0, 1}));
  const LandedWrite f = frame("r", 0, 0, 0);
  ASSERT_TRUE(a.admit(f));
  a.abandoned(f);  // its connection closed mid-payload
  EXPECT_FALSE(a.any()) << "it counts for nothing";
  EXPECT_TRUE(a.withdraw(9));
  auto events = a.take();
  ASSERT_EQ(events.size(), 1u) << "answered at once";
  EXPECT_EQ(events[0].kind, ArrivalEvent::kWithdrawn);
}

TEST(Arrivals, NothingToWaitForArrivesAtOnce) {
  Arrivals a(geometry(), nullptr);
  ASSERT_TRUE(a.expect(5, "cached", {}));
  auto events = a.take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kArrived);
}

// The decode engine's declaration and the prefill engine's writes take
// different paths to a rank and race: what landed first counts once the
// declaration comes.
TEST(Arrivals, WritesThatLandedBeforeTheDeclarationCountOnceItComes) {
  Arrivals a(geometry(), nullptr);
  for (uint32_t l = 0; l < 2; ++l)
    ASSERT_TRUE(deliver(a, frame("early", l, 0, 4, 2)));
  EXPECT_FALSE(a.any());
  ASSERT_TRUE(a.expect(8, "early", {4, 5}));
  EXPECT_FALSE(a.any()) << "the V tensors are still missing";
  for (uint32_t l = 0; l < 2; ++l)
    ASSERT_TRUE(deliver(a, frame("early", l, 1, 4, 2)));
  auto events = a.take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kArrived);
  EXPECT_EQ(events[0].bytes, 2 * 2 * 2 * kBlock) << "each block once";
}

TEST(Arrivals, AWriteBeforeTheDeclarationOutsideItsBlocksFailsTheRequest) {
  Arrivals a(geometry(), nullptr);
  ASSERT_TRUE(deliver(a, frame("stray", 0, 0, 10)));
  ASSERT_TRUE(a.expect(2, "stray", {11}));
  auto events = a.take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kFailed);
  EXPECT_EQ(events[0].message,
            "a write of request 'stray' went to destination block 10 before it was declared, "
            "which it did not declare");
}

TEST(Arrivals, AWriteAdmittedBeforeTheDeclarationHoldsUpAWithdrawalUntilItLands) {
  Arrivals a(geometry(), nullptr);
  const LandedWrite f = frame("racing", 0, 0, 0);
  ASSERT_TRUE(a.admit(f));  // undeclared, its payload is being read
  ASSERT_TRUE(a.expect(6, "racing", {0}));
  EXPECT_TRUE(a.withdraw(6));
  EXPECT_FALSE(a.any()) << "its payload is still being written";
  a.landed(f);
  auto events = a.take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kWithdrawn);
}

TEST(Arrivals, AWriteAdmittedBeforeTheDeclarationOutsideItsBlocksFailsItWhenItLands) {
  Arrivals a(geometry(), nullptr);
  const LandedWrite f = frame("racing", 0, 0, 3);
  ASSERT_TRUE(a.admit(f));
  ASSERT_TRUE(a.expect(6, "racing", {2}));
  a.landed(f);
  auto events = a.take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kFailed);
  EXPECT_EQ(events[0].message,
            "a write of request 'racing' went to destination block 3, which it did not declare");
}

// A request declared from instance "p0": another keyed instance's writes of
// it are refused and fail nothing (it cannot fail, fill or complete another
// engine's request), and its early writes count for nothing; p0's do.
TEST(Arrivals, OnlyTheNamedSendersWritesCountAndAnotherInstanceFailsNothing) {
  Arrivals a(geometry(), nullptr);
  // Early, before the declaration: the intruder's block 5 and p0's block 6.
  LandedWrite intruder = frame("scoped", 0, 0, 5);
  intruder.sender = "mallory";
  ASSERT_TRUE(deliver(a, intruder));
  LandedWrite mine = frame("scoped", 0, 0, 6);
  mine.sender = "p0";
  ASSERT_TRUE(deliver(a, mine));
  ASSERT_TRUE(a.expect(1, "scoped", {5, 6}, "p0"));

  // The intruder's write outside the request's blocks would fail it if it
  // counted; inside them, it would fill them.
  for (uint32_t block : {5u, 9u}) {
    LandedWrite w = frame("scoped", 0, 1, block);
    w.sender = "mallory";
    Status s = a.admit(w);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.error().message,
              "request 'scoped' is expected from instance 'p0', not from 'mallory'");
  }
  EXPECT_FALSE(a.any());
  for (uint32_t l = 0; l < 2; ++l)
    for (uint32_t t = 0; t < 2; ++t)
      for (uint32_t block : {5u, 6u}) {
        if (l == 0 && t == 0 && block == 6) continue;  // p0's early write counted
        EXPECT_FALSE(a.any()) << "layer " << l << " tensor " << t << " block " << block;
        LandedWrite w = frame("scoped", l, t, block);
        w.sender = "p0";
        ASSERT_TRUE(deliver(a, w));
      }
  auto events = a.take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kArrived);
}

// A write admitted from another instance before the declaration holds the
// withdrawal while its bytes are written (they land in the blocks) and
// counts for nothing when it lands.
TEST(Arrivals, AnotherInstancesWriteInFlightAtTheDeclarationCountsForNothing) {
  Arrivals a(geometry(), nullptr);
  LandedWrite intruder = frame("scoped", 0, 0, 2, 2);
  intruder.sender = "mallory";
  ASSERT_TRUE(a.admit(intruder));
  ASSERT_TRUE(a.expect(1, "scoped", {2}, "p0"));
  a.landed(intruder);  // also went to block 3, undeclared: fails nothing
  EXPECT_FALSE(a.any());
  EXPECT_TRUE(a.withdraw(1));
  auto events = a.take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kWithdrawn);
}

// With a nonce the request's key is one that a peer without the nonce
// cannot compute: a write named by the bare id is some other request's, and
// may not touch the declared blocks.
TEST(Arrivals, ARequestDeclaredWithANonceCannotBeNamedByItsIdAlone) {
  Arrivals a(geometry(), nullptr);
  const uint64_t nonce = 0x5eed5eed5eed5eedull;
  ASSERT_NE(request_key("secret", nonce), request_key("secret"));
  ASSERT_NE(request_key("secret", nonce), request_key("secret", nonce + 1));
  EXPECT_EQ(request_key("secret", 0), request_key("secret"));
  ASSERT_TRUE(a.expect(1, "secret", {4}, "", nonce));
  Status s = a.admit(frame("secret", 0, 0, 4));
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().message,
            "a write goes to destination block 4, which request 'secret' declared");
  LandedWrite keyed = frame("secret", 0, 0, 4);
  keyed.request_key = request_key("secret", nonce);
  EXPECT_TRUE(deliver(a, keyed));
}

// request_key() without a nonce is FNV-1a 64 (the published test vectors).
TEST(Arrivals, TheUnkeyedRequestKeyIsFnv1a64) {
  EXPECT_EQ(request_key("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(request_key("foobar"), 0x85944171f73967e8ull);
}

}  // namespace
}  // namespace kvrelay::worker

namespace kvrelay::worker {
namespace {

// Heterogeneous TP: 4 heads per block, written by several prefill ranks.
PoolGeometry four_heads() {
  PoolGeometry g = geometry();
  g.kv_heads = 4;
  return g;
}
constexpr uint64_t kHead = kBlock;  // geometry()'s block was one head
LandedWrite heads(const std::string& id, uint32_t layer, uint32_t tensor, uint32_t block,
                  uint32_t first_head, uint32_t count) {
  LandedWrite f;
  f.request_key = request_key(id);
  f.layer = layer;
  f.tensor = tensor;
  f.dst_offset = block * 4 * kHead + first_head * kHead;
  f.bytes = count * kHead;
  return f;
}

TEST(Arrivals, ABlockFilledByHeadRangesArrivesOnlyOnceEveryHeadHasLanded) {
  Arrivals a(four_heads(), nullptr);
  ASSERT_TRUE(a.expect(3, "split", {5}));
  for (uint32_t l = 0; l < 2; ++l)
    for (uint32_t t = 0; t < 2; ++t) {
      ASSERT_TRUE(deliver(a, heads("split", l, t, 5, 0, 2)));  // prefill rank 0's half
      if (l == 1 && t == 1) {
        ASSERT_TRUE(deliver(a, heads("split", l, t, 5, 0, 2))) << "a repeat adds no head";
        ASSERT_TRUE(deliver(a, heads("split", l, t, 5, 2, 1)));
        EXPECT_FALSE(a.any()) << "head 3 of layer 1, V is still missing";
        ASSERT_TRUE(deliver(a, heads("split", l, t, 5, 3, 1)));
      } else {
        ASSERT_TRUE(deliver(a, heads("split", l, t, 5, 2, 2)));  // prefill rank 1's half
      }
    }
  auto events = a.take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kArrived);
  EXPECT_EQ(events[0].bytes, 2 * 2 * 4 * kHead) << "each block once, whole";
}

TEST(Arrivals, HeadRangesThatLandedBeforeTheDeclarationCountOnceItComes) {
  Arrivals a(four_heads(), nullptr);
  for (uint32_t l = 0; l < 2; ++l)
    for (uint32_t t = 0; t < 2; ++t) ASSERT_TRUE(deliver(a, heads("late", l, t, 7, 0, 2)));
  ASSERT_TRUE(a.expect(4, "late", {7}));
  EXPECT_FALSE(a.any()) << "heads 2 and 3 are still missing everywhere";
  for (uint32_t l = 0; l < 2; ++l)
    for (uint32_t t = 0; t < 2; ++t) ASSERT_TRUE(deliver(a, heads("late", l, t, 7, 2, 2)));
  auto events = a.take();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ArrivalEvent::kArrived);
}

TEST(Arrivals, AHeadRangeIntoAnotherRequestsBlockIsRefused) {
  Arrivals a(four_heads(), nullptr);
  ASSERT_TRUE(a.expect(1, "owner", {2}));
  const Status s = deliver(a, heads("intruder", 0, 0, 2, 1, 1));
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().message,
            "a write goes to destination block 2, which request 'owner' declared");
}

}  // namespace
}  // namespace kvrelay::worker
