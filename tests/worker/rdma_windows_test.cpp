// The receiving rdma session's memory windows, over the fake fabric, whose
// windows check their range and queue pair as a device that enforces them
// would (fake_fabric.h): what a grant's keys let a peer write, and for how
// long; how many windows a session holds, and what happens when there are
// none to be had. The transport's tests (rdma_transport_test.cpp) move
// whole requests through them.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include "fake_fabric.h"
#include "support/pool_patterns.h"
#include "worker/arrivals.h"
#include "worker/rdma/rdma_receiver.h"

namespace kvrelay::worker::rdma {
namespace {

using testing::FakeFabric;

class RdmaWindowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dst =
        kvrelay::testing::make_test_pool("rdmawin", "dst", kvrelay::testing::transport_geometry());
    arrivals = std::make_shared<Arrivals>(dst->geometry(), nullptr);
    source.assign(64 * 1024, std::byte{0x5a});
    Result<std::unique_ptr<Registration>> r =
        fabric.register_memory(source.data(), source.size(), RemoteAccess::kWrite);
    ASSERT_TRUE(r);
    source_reg = std::move(r).value();
    listener = std::make_unique<RdmaListener>(&fabric, "", *dst, 0);
    for (int i = 0; i < 2; ++i) {
      Result<std::unique_ptr<RcQueuePair>> qp = fabric.create_queue_pair();
      ASSERT_TRUE(qp);
      offer.push_back((*qp)->local());
      theirs.push_back(std::move(qp).value());
    }
    Result<std::unique_ptr<RdmaSession>> s =
        RdmaSession::accept(*listener, *arrivals, offer, "test peer", "p0");
    ASSERT_TRUE(s) << s.error().message;
    session = std::move(s).value();
    for (size_t i = 0; i < theirs.size(); ++i)
      ASSERT_TRUE(theirs[i]->connect(session->endpoints()[i]));
  }
  void TearDown() override {
    session.reset();
    if (dst) (void)dst->segment().unlink();
  }

  uint32_t tensors() const { return dst->geometry().tensors_per_layer(); }
  uint64_t block_bytes() const { return dst->geometry().block_bytes(PoolTensor::kKey); }
  // Where block `block` of the K tensor of `layer` is, as work requests address it.
  uint64_t key_block(uint32_t layer, uint64_t block) const {
    return session->registration().address(layer, 0) + block * block_bytes();
  }

  // The session's grant for `part`: from on_intent, or from poll() once
  // its windows are bound. Nothing: none yet.
  std::optional<std::vector<Grant>> answer(const Intent& part) {
    Result<std::optional<std::vector<Grant>>> r = session->on_intent(part);
    EXPECT_TRUE(r) << r.error().message;
    if (!r) return std::nullopt;
    if (*r) return *r;
    return poll();
  }
  // What poll() hands out now (acks go to `acks`).
  std::optional<std::vector<Grant>> poll() {
    std::vector<Grant> grants;
    Status s = session->poll(acks, grants);
    EXPECT_TRUE(s) << s.error().message;
    if (grants.empty()) return std::nullopt;
    return grants;
  }

  // Writes `blocks` blocks from the source to `remote` under `rkey`, from a
  // fresh queue pair connected to the session's queue pair `to` (a failed
  // write leaves a queue pair in error); the write's completion status, ""
  // when it landed.
  std::string write(uint32_t to, uint32_t rkey, uint64_t remote, uint32_t blocks,
                    std::optional<uint32_t> immediate = std::nullopt) {
    Result<std::unique_ptr<RcQueuePair>> qp = fabric.create_queue_pair();
    if (!qp) return "no queue pair";
    (void)(*qp)->connect(session->endpoints()[to]);
    WriteRequest wr;
    wr.wr_id = 1;
    wr.local_address = reinterpret_cast<uint64_t>(source.data());
    wr.length = static_cast<uint32_t>(blocks * block_bytes());
    wr.lkey = source_reg->lkey();
    wr.remote_address = remote;
    wr.rkey = rkey;
    wr.immediate = immediate;
    wr.signaled = true;
    Result<size_t> posted = (*qp)->post_writes({&wr, 1});
    if (!posted || *posted != 1) return "not posted";
    WorkCompletion wc;
    if ((*qp)->poll_send({&wc, 1}) != 1) return "no completion";
    return wc.ok ? "" : wc.status;
  }

  FakeFabric fabric;  // outlives every queue pair and window
  std::unique_ptr<HostSegmentPool> dst;
  std::shared_ptr<Arrivals> arrivals;
  std::vector<std::byte> source;
  std::unique_ptr<Registration> source_reg;
  std::unique_ptr<RdmaListener> listener;
  std::vector<QpEndpoint> offer;
  std::vector<std::unique_ptr<RcQueuePair>> theirs;
  std::unique_ptr<RdmaSession> session;
  std::vector<Ack> acks;
};

// A grant's keys are windows bound for it on the queue pair its intent
// named, one per run and tensor: the pool registration's own key writes
// nothing remotely; a window writes its run's blocks, and not the block
// past them, nor from the peer of another queue pair; and nothing once the
// transfer landed (its windows are invalidated before its ack).
TEST_F(RdmaWindowsTest, AGrantsKeysWriteOnlyItsRunsFromItsQueuePairUntilItLands) {
  ASSERT_TRUE(session->registration().windows());
  Intent part;
  part.transfer = 7;
  part.layer = 1;
  part.queue_pair = 1;
  part.runs = {BlockSpan{2, 3}, BlockSpan{9, 1}};
  Result<std::optional<std::vector<Grant>>> pending = session->on_intent(part);
  ASSERT_TRUE(pending && !*pending) << "the grant waits for its windows' binds";
  std::optional<std::vector<Grant>> grant = poll();
  ASSERT_TRUE(grant);
  ASSERT_EQ(grant->size(), 1u);
  const Grant& g = grant->front();
  ASSERT_TRUE(g.ok) << g.reason;
  ASSERT_EQ(g.rkeys.size(), 2u * tensors());
  EXPECT_EQ(fabric.binds.load(), 2u * tensors()) << "a window per run and tensor";
  const uint32_t run0_key = g.rkeys[0];          // run 0 (blocks 2..4), K
  const uint32_t run1_key = g.rkeys[tensors()];  // run 1 (block 9), K
  EXPECT_NE(run0_key, run1_key);

  const uint32_t pool_key = session->registration().tensors()[1 * tensors()].rkey;
  EXPECT_EQ(write(1, pool_key, key_block(1, 2), 1), "remote access error")
      << "the pool's own key writes nothing remotely";
  EXPECT_EQ(write(1, run0_key, key_block(1, 2), 3), "") << "the run's blocks";
  EXPECT_EQ(write(1, run0_key, key_block(1, 5), 1), "remote access error") << "the block past it";
  EXPECT_EQ(write(1, run0_key, key_block(1, 9), 1), "remote access error") << "the other run's";
  EXPECT_EQ(write(0, run0_key, key_block(1, 2), 1), "remote access error")
      << "from the peer of another queue pair";
  EXPECT_EQ(write(1, run1_key, key_block(1, 9), 1), "");
  EXPECT_EQ(write(1, run0_key, key_block(2, 2), 1), "remote access error") << "another layer";

  // The last write, with the transfer's immediate: it lands, its windows
  // are invalidated, and only then is it acked.
  EXPECT_EQ(write(1, run1_key, key_block(1, 9), 1, immediate_of(7)), "");
  EXPECT_FALSE(poll());
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].transfer, 7u);
  EXPECT_TRUE(acks[0].status);
  EXPECT_EQ(fabric.invalidations.load(), 2u * tensors());
  EXPECT_EQ(write(1, run0_key, key_block(1, 2), 1), "remote access error")
      << "a landed transfer's window";
  EXPECT_EQ(session->windows_held(), 2u * tensors()) << "kept, spare, for the next grant";
  EXPECT_EQ(session->open_transfers(), 0u);

  // The next grant binds the spare windows again, under fresh keys.
  part.transfer = 8;
  part.runs = {BlockSpan{2, 1}};
  std::optional<std::vector<Grant>> next = answer(part);
  ASSERT_TRUE(next && next->front().ok);
  EXPECT_EQ(fabric.live_windows.load(), 2u * tensors()) << "no window allocated anew";
  EXPECT_NE(next->front().rkeys[0], run0_key);
  EXPECT_NE(next->front().rkeys[0], run1_key);
  EXPECT_EQ(write(1, next->front().rkeys[0], key_block(1, 2), 1), "");
}

// The runs of a scattered layer share windows past kWindowGroups of them:
// each group's window spans its runs, and every run's key writes it.
TEST_F(RdmaWindowsTest, AScatteredLayerBindsAWindowPerGroupOfRuns) {
  Intent part;
  part.transfer = 3;
  part.layer = 0;
  part.queue_pair = 0;
  for (uint32_t b = 0; b < 32; b += 2)
    part.runs.push_back(BlockSpan{b, 1});  // 16 runs of one block
  part.runs.push_back(BlockSpan{31, 1});
  const size_t runs = part.runs.size();
  ASSERT_GT(runs, RdmaSession::kWindowGroups);
  std::optional<std::vector<Grant>> grant = answer(part);
  ASSERT_TRUE(grant && grant->front().ok);
  EXPECT_EQ(fabric.binds.load(), RdmaSession::kWindowGroups * tensors());
  ASSERT_EQ(grant->front().rkeys.size(), runs * tensors());
  for (size_t r = 0; r < runs; ++r)
    EXPECT_EQ(write(0, grant->front().rkeys[r * tensors()], key_block(0, part.runs[r].first), 1),
              "")
        << "run " << r;
}

// An intent of no runs has nothing to bind: it is granted at once, with no
// keys, and lands like any other.
TEST_F(RdmaWindowsTest, AnIntentOfNoRunsIsGrantedAtOnceWithNoKeys) {
  Intent part;
  part.transfer = 5;
  part.queue_pair = 1;
  Result<std::optional<std::vector<Grant>>> r = session->on_intent(part);
  ASSERT_TRUE(r && *r) << "not left waiting for a bind that never comes";
  ASSERT_EQ((*r)->size(), 1u);
  EXPECT_TRUE((*r)->front().ok);
  EXPECT_TRUE((*r)->front().rkeys.empty());
  EXPECT_EQ(fabric.binds.load(), 0u);
  EXPECT_EQ(write(1, 0, 0, 0, immediate_of(5)), "");
  EXPECT_FALSE(poll());
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].transfer, 5u);
}

// A session holds at most max_windows: a grant that finds none free waits
// for a landing to return some; one that needs more than that is refused,
// naming the limit; and where the device has none to give and the session
// holds none in use, the transfer is refused saying so.
TEST_F(RdmaWindowsTest, AGrantWaitsForWindowsAndIsRefusedWhereNoneCanBeHad) {
  listener->max_windows = tensors();  // one run's worth
  Intent part;
  part.layer = 0;
  part.queue_pair = 0;
  part.transfer = 1;
  part.runs = {BlockSpan{0, 1}};
  std::optional<std::vector<Grant>> first = answer(part);
  ASSERT_TRUE(first && first->front().ok);

  part.transfer = 2;
  part.runs = {BlockSpan{4, 1}};
  EXPECT_FALSE(answer(part)) << "no window free until transfer 1 lands";
  EXPECT_EQ(session->windows_held(), tensors());

  part.transfer = 3;
  part.runs = {BlockSpan{8, 1}, BlockSpan{10, 1}};
  std::optional<std::vector<Grant>> too_many = answer(part);
  ASSERT_TRUE(too_many);
  EXPECT_FALSE(too_many->front().ok);
  EXPECT_NE(too_many->front().reason.find("needs 4 memory windows; a session holds at most 2"),
            std::string::npos)
      << too_many->front().reason;

  EXPECT_EQ(write(0, first->front().rkeys[0], key_block(0, 0), 1, immediate_of(1)), "");
  EXPECT_FALSE(poll()) << "the landing's poll posts transfer 2's binds";
  ASSERT_EQ(acks.size(), 1u) << "transfer 1 landed";
  std::optional<std::vector<Grant>> second = poll();  // their completions (the fd rang)
  ASSERT_TRUE(second) << "and transfer 2 got its windows";
  EXPECT_EQ(second->front().transfer, 2u);
  EXPECT_EQ(write(0, second->front().rkeys[0], key_block(0, 4), 1), "");

  // A second session on a device with no windows left, holding none: refused.
  fabric.max_windows = fabric.live_windows.load();
  Result<std::unique_ptr<RdmaSession>> other =
      RdmaSession::accept(*listener, *arrivals, offer, "other peer", "p1");
  ASSERT_TRUE(other);
  part.transfer = 4;
  part.runs = {BlockSpan{12, 1}};
  Result<std::optional<std::vector<Grant>>> refused = (*other)->on_intent(part);
  ASSERT_TRUE(refused && *refused);
  EXPECT_FALSE((*refused)->front().ok);
  EXPECT_NE((*refused)->front().reason.find("cannot allocate memory windows"), std::string::npos)
      << (*refused)->front().reason;
  EXPECT_EQ((*other)->open_transfers(), 0u) << "nothing of it kept";
}

}  // namespace
}  // namespace kvrelay::worker::rdma
