// SpscRing: functional behaviour in one process, then a producer and a
// consumer in two processes exchanging a long numbered stream.
#include "shm/spsc_ring.h"

#include <gtest/gtest.h>

#include <cstring>

#include "support/processes.h"

namespace kvrelay {
namespace {

using testing::SharedRegion;
using namespace std::chrono_literals;

// An odd-sized record (24 bytes, not a power of two) with a checksum, so that
// torn or mixed-up records are detected.
struct Record {
  uint64_t seq;
  uint64_t payload;
  uint64_t check;
};
Record make_record(uint64_t seq) {
  return Record{seq, seq * 0x9E3779B97F4A7C15ULL, ~seq};
}
bool intact(const Record& r) {
  return r.payload == r.seq * 0x9E3779B97F4A7C15ULL && r.check == ~r.seq;
}

SpscRing<Record> make_ring(SharedRegion& mem, uint32_t capacity) {
  EXPECT_TRUE(SpscRing<Record>::initialize(mem.data(), mem.size(), capacity).ok());
  auto r = SpscRing<Record>::attach(mem.data(), mem.size());
  EXPECT_TRUE(r.ok());
  return r.value();
}

TEST(SpscRing, PopsWhatWasPushedInOrderAcrossManyWrapArounds) {
  SharedRegion mem(SpscRing<Record>::bytes_for(8));
  auto ring = make_ring(mem, 8);
  uint64_t next_push = 0;
  uint64_t next_pop = 0;
  // Push in bursts of 1..8 and drain partially, so head and tail wrap at
  // every offset of the 8-slot ring.
  for (int round = 0; round < 1000; ++round) {
    const int burst = 1 + round % 8;
    for (int i = 0; i < burst && ring.try_push(make_record(next_push)); ++i)
      ++next_push;
    Record r{};
    for (int i = 0; i < (round % 3 == 0 ? 8 : 3) && ring.try_pop(r); ++i) {
      ASSERT_EQ(r.seq, next_pop);
      ASSERT_TRUE(intact(r));
      ++next_pop;
    }
  }
  Record r{};
  while (ring.try_pop(r)) {
    ASSERT_EQ(r.seq, next_pop++);
  }
  EXPECT_EQ(next_pop, next_push);
  EXPECT_GT(next_push, 3000u);
}

TEST(SpscRing, TryPushFailsWhenFullAndCountsTheEvent) {
  SharedRegion mem(SpscRing<Record>::bytes_for(4));
  auto ring = make_ring(mem, 4);
  for (uint64_t i = 0; i < 4; ++i)
    ASSERT_TRUE(ring.try_push(make_record(i)));
  EXPECT_FALSE(ring.try_push(make_record(4)));
  EXPECT_EQ(ring.header().full_events.load(), 1u);
  // Nothing was overwritten: the four originals come out intact.
  Record r{};
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(ring.try_pop(r));
    EXPECT_EQ(r.seq, i);
  }
  EXPECT_FALSE(ring.try_pop(r));
}

TEST(SpscRing, BlockingPushOnAFullRingTimesOut) {
  SharedRegion mem(SpscRing<Record>::bytes_for(2));
  auto ring = make_ring(mem, 2);
  ASSERT_TRUE(ring.try_push(make_record(0)));
  ASSERT_TRUE(ring.try_push(make_record(1)));
  Status s = ring.push(make_record(2), Deadline::after(20ms));
  EXPECT_EQ(s.code(), Errc::kTimeout);
  EXPECT_EQ(ring.size(), 2u);
}

TEST(SpscRing, BlockingPopOnAnEmptyRingTimesOut) {
  SharedRegion mem(SpscRing<Record>::bytes_for(2));
  auto ring = make_ring(mem, 2);
  Record r{};
  EXPECT_EQ(ring.pop(r, Deadline::after(20ms)).code(), Errc::kTimeout);
}

TEST(SpscRing, NoWakeSyscallWhenNobodyIsParked) {
  SharedRegion mem(SpscRing<Record>::bytes_for(16));
  auto ring = make_ring(mem, 16);
  Record r{};
  for (uint64_t i = 0; i < 1000; ++i) {
    ASSERT_TRUE(ring.try_push(make_record(i)));
    ASSERT_TRUE(ring.try_pop(r));
  }
  EXPECT_EQ(ring.header().not_empty.wake_calls.load(), 0u);
  EXPECT_EQ(ring.header().not_full.wake_calls.load(), 0u);
}

TEST(SpscRing, AttachRefusesAWrongRecordSizeAndABadCapacity) {
  SharedRegion mem(SpscRing<Record>::bytes_for(8));
  ASSERT_TRUE(SpscRing<Record>::initialize(mem.data(), mem.size(), 8).ok());
  auto wrong = SpscRing<uint64_t>::attach(mem.data(), mem.size());
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.code(), Errc::kLayoutMismatch);
  EXPECT_NE(wrong.error().message.find("24-byte records"), std::string::npos);

  mem.as<SpscRingHeader>()->capacity = 6;
  auto bad = SpscRing<Record>::attach(mem.data(), mem.size());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), Errc::kCorrupt);

  mem.as<SpscRingHeader>()->capacity = 1U << 20;  // would run past the region
  EXPECT_EQ(SpscRing<Record>::attach(mem.data(), mem.size()).code(), Errc::kCorrupt);
}

TEST(SpscRing, InitializeRefusesACapacityThatIsNotAPowerOfTwo) {
  SharedRegion mem(SpscRing<Record>::bytes_for(8));
  EXPECT_EQ(SpscRing<Record>::initialize(mem.data(), mem.size(), 6).code(), Errc::kInvalidArgument);
}

// Two processes, a small ring (so both sides park and wake often), blocking
// calls on both sides: every record arrives exactly once, in order, intact.
TEST(SpscRingProcesses, ProducerAndConsumerProcessesExchangeAMillionRecordsExactlyOnceInOrder) {
  constexpr uint64_t kCount = 1'000'000;
  SharedRegion mem(SpscRing<Record>::bytes_for(64));
  auto ring = make_ring(mem, 64);

  const pid_t producer = testing::fork_child([&] {
    for (uint64_t i = 0; i < kCount; ++i) {
      if (!ring.push(make_record(i), Deadline::after(30s)).ok()) return 2;
    }
    return 0;
  });

  uint64_t expected = 0;
  uint64_t bad = 0;
  Record r{};
  while (expected < kCount) {
    if (!ring.pop(r, Deadline::after(30s)).ok()) break;
    if (r.seq != expected || !intact(r)) ++bad;
    expected = r.seq + 1;
  }
  auto exit = testing::wait_child(producer, 30s);
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(exit->exited);
  EXPECT_EQ(exit->code, 0);
  EXPECT_EQ(expected, kCount);
  EXPECT_EQ(bad, 0u);
  EXPECT_FALSE(ring.try_pop(r)) << "nothing beyond the last record";
}

}  // namespace
}  // namespace kvrelay
