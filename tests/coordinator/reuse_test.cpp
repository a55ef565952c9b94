// What the task table reuses (coordinator/reuse.h): a node taken out of a
// map comes back with its key's storage, a message copy is the message and
// its buffer is handed on zeroed, and a scratch message held twice builds
// the second in a buffer of its own.
#include "coordinator/reuse.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <string_view>
#include <unordered_map>

#include "schemas/kvrelay.capnp.h"

namespace kvrelay::coordinator {
namespace {

TEST(NodePool, AnErasedEntrysNodeHoldsTheNextKeyAndValue) {
  using Map = std::unordered_map<std::string, int>;
  Map map;
  NodePool<Map> pool(4);
  const std::string long_key(100, 'k');
  pool.put(map, long_key, 1);
  const char* storage = map.begin()->first.data();
  pool.erase(map, map.begin());
  EXPECT_TRUE(map.empty());
  EXPECT_EQ(pool.spare(), 1u);
  const std::string next(90, 'n');
  auto it = pool.put(map, std::string_view(next), 2);  // as the table puts ids: a view
  EXPECT_EQ(it->first, std::string(90, 'n'));
  EXPECT_EQ(it->second, 2);
  EXPECT_EQ(it->first.data(), storage) << "the key was assigned into the kept string";
  EXPECT_EQ(pool.spare(), 0u);
  // A key already there keeps its entry, takes the new value and the node stays spare.
  pool.erase(map, pool.put(map, std::string("x"), 3));
  pool.put(map, std::string(90, 'n'), 4);
  EXPECT_EQ(map.size(), 1u);
  EXPECT_EQ(map.begin()->second, 4);
  EXPECT_EQ(pool.spare(), 1u);
}

TEST(NodePool, KeepsNoMoreThanItsLimitAndServesMultimaps) {
  using Timers = std::multimap<uint64_t, uint64_t>;
  Timers timers;
  NodePool<Timers> pool(1);
  pool.put_multi(timers, 5, 1);
  pool.put_multi(timers, 5, 2);
  EXPECT_EQ(timers.count(5), 2u);
  pool.erase(timers, timers.begin());
  pool.erase(timers, timers.begin());
  EXPECT_EQ(pool.spare(), 1u) << "the second node was freed";
  auto it = pool.put_multi(timers, 7, 3);
  EXPECT_EQ(it->first, 7u);
  EXPECT_EQ(it->second, 3u);
}

TEST(MessageCopies, ACopyIsTheMessageAndItsBufferComesBackZeroed) {
  MessageCopies copies(4, 1024);
  capnp::MallocMessageBuilder original;
  auto swap = original.initRoot<schema::SwapTask>();
  swap.setRequestId(std::string(200, 'a'));
  swap.initDeviceBlockIds(3).set(2, 42);
  {
    MessageCopies::Copy c = copies.copy(swap.asReader());
    auto root = c.message().getRoot<schema::SwapTask>().asReader();
    EXPECT_EQ(std::string(root.getRequestId().cStr()), std::string(200, 'a'));
    EXPECT_EQ(root.getDeviceBlockIds()[2], 42u);
    EXPECT_EQ(c.message().getSegmentsForOutput().size(), 1u) << "one segment: exactly sized";
  }
  EXPECT_EQ(copies.spare(), 1u);
  // The same buffer, for a smaller message (capnp refuses a first segment
  // that is not zeroed): nothing of the first shows through.
  capnp::MallocMessageBuilder small;
  small.initRoot<schema::SwapTask>().setRequestId("b");
  MessageCopies::Copy c = copies.copy(small.getRoot<schema::SwapTask>().asReader());
  EXPECT_EQ(copies.spare(), 0u);
  auto root = c.message().getRoot<schema::SwapTask>().asReader();
  EXPECT_EQ(std::string(root.getRequestId().cStr()), "b");
  EXPECT_EQ(root.getDeviceBlockIds().size(), 0u);
}

TEST(MessageCopies, ABufferLargerThanTheLimitIsNotKept) {
  MessageCopies copies(4, 64);
  capnp::MallocMessageBuilder big;
  big.initRoot<schema::SwapTask>().setRequestId(std::string(4096, 'z'));
  { (void)copies.copy(big.getRoot<schema::SwapTask>().asReader()); }
  EXPECT_EQ(copies.spare(), 0u);
}

TEST(ScratchMessage, ASecondHolderBuildsInABufferOfItsOwn) {
  ScratchMessage::Space space(64);
  {
    ScratchMessage first(space);
    first->initRoot<schema::Cancel>().setRequestId("first");
    ScratchMessage second(space);
    second->initRoot<schema::Cancel>().setRequestId("second");
    EXPECT_NE(first->getSegmentsForOutput()[0].begin(), second->getSegmentsForOutput()[0].begin());
    EXPECT_EQ(std::string(first->getRoot<schema::Cancel>().getRequestId().cStr()), "first");
    EXPECT_EQ(std::string(second->getRoot<schema::Cancel>().getRequestId().cStr()), "second");
  }
  // Zeroed again: a new message in the space starts clean.
  ScratchMessage again(space);
  auto c = again->initRoot<schema::Cancel>();
  EXPECT_EQ(c.getRequestId().size(), 0u);
}

}  // namespace
}  // namespace kvrelay::coordinator
