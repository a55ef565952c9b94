// MpscRing: functional behaviour, many producer processes into one consumer,
// backpressure, and records abandoned half-written by a dying producer.
#include "shm/mpsc_ring.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <vector>

#include "support/processes.h"

namespace kvrelay {
namespace {

using testing::SharedRegion;
using namespace std::chrono_literals;

MpscRing make_ring(SharedRegion& mem, uint64_t capacity) {
  EXPECT_TRUE(MpscRing::initialize(mem.data(), mem.size(), capacity,
                                   MpscRing::default_max_payload(capacity))
                  .ok());
  auto r = MpscRing::attach(mem.data(), mem.size());
  EXPECT_TRUE(r.ok());
  return r.value();
}

// Payload: [producer u32][seq u32][filler bytes derived from both], of a
// length that varies with seq so records land at every alignment.
std::vector<std::byte> make_payload(uint32_t producer, uint32_t seq, size_t len) {
  std::vector<std::byte> p(std::max<size_t>(len, 8));
  std::memcpy(p.data(), &producer, 4);
  std::memcpy(p.data() + 4, &seq, 4);
  for (size_t i = 8; i < p.size(); ++i)
    p[i] = std::byte((producer * 31 + seq * 7 + i) & 0xff);
  return p;
}
bool payload_intact(std::span<const std::byte> p, uint32_t& producer, uint32_t& seq) {
  if (p.size() < 8) return false;
  std::memcpy(&producer, p.data(), 4);
  std::memcpy(&seq, p.data() + 4, 4);
  for (size_t i = 8; i < p.size(); ++i)
    if (p[i] != std::byte((producer * 31 + seq * 7 + i) & 0xff)) return false;
  return true;
}

std::span<const std::byte> as_bytes(const std::vector<std::byte>& v) {
  return {v.data(), v.size()};
}

TEST(MpscRing, RecordsOfOddSizesComeOutInOrderAcrossWrapArounds) {
  SharedRegion mem(MpscRing::bytes_for(1024));
  auto ring = make_ring(mem, 1024);
  uint32_t next_write = 0;
  uint32_t next_read = 0;
  size_t wraps_with_padding = 0;
  for (int round = 0; round < 2000; ++round) {
    // Lengths 8..120, none a multiple of the 8-byte alignment after the header.
    const size_t len = 8 + (next_write * 13) % 113;
    const uint64_t tail_before = ring.header().tail.load();
    if (ring.try_write(1 + int32_t(next_write % 5), as_bytes(make_payload(0, next_write, len)))
            .ok()) {
      const uint64_t advanced = ring.header().tail.load() - tail_before;
      if (advanced > ((8 + len + 7) & ~size_t{7})) ++wraps_with_padding;
      ++next_write;
    }
    if (round % 3 != 0) {
      ring.read(
          [&](int32_t type, std::span<const std::byte> p) {
            uint32_t producer = 0, seq = 0;
            ASSERT_TRUE(payload_intact(p, producer, seq));
            ASSERT_EQ(seq, next_read);
            ASSERT_EQ(type, 1 + int32_t(seq % 5));
            ASSERT_EQ(p.size(), 8 + (seq * 13) % 113);
            ++next_read;
          },
          2);
    }
  }
  ring.read([&](int32_t, std::span<const std::byte> p) {
    uint32_t producer = 0, seq = 0;
    ASSERT_TRUE(payload_intact(p, producer, seq));
    ASSERT_EQ(seq, next_read++);
  });
  EXPECT_EQ(next_read, next_write);
  EXPECT_GT(next_write, 1000u);
  EXPECT_GT(wraps_with_padding, 10u) << "the test must exercise padding records at the wrap";
}

TEST(MpscRing, FullRingRefusesTryWriteAndNeverOverwrites) {
  SharedRegion mem(MpscRing::bytes_for(256));
  auto ring = make_ring(mem, 256);
  uint32_t written = 0;
  while (ring.try_write(1, as_bytes(make_payload(0, written, 24))).ok())
    ++written;
  EXPECT_EQ(written, 256u / 32u);  // 8-byte header + 24 bytes each
  Status s = ring.try_write(1, as_bytes(make_payload(0, 99, 24)));
  EXPECT_EQ(s.code(), Errc::kFull);
  EXPECT_GE(ring.header().full_events.load(), 1u);
  uint32_t next = 0;
  ring.read([&](int32_t, std::span<const std::byte> p) {
    uint32_t producer = 0, seq = 0;
    ASSERT_TRUE(payload_intact(p, producer, seq));
    EXPECT_EQ(seq, next++);
  });
  EXPECT_EQ(next, written);
}

// Regression: a producer's cached head more than a lap behind the tail made
// the free space computation wrap around, and a full ring looked empty.
TEST(MpscRing, HeadCacheALapBehindStillSeesAFullRing) {
  SharedRegion mem(MpscRing::bytes_for(256));
  auto ring = make_ring(mem, 256);
  for (uint32_t i = 0; i < 100; ++i) {  // go round the ring many times
    ASSERT_TRUE(ring.try_write(1, as_bytes(make_payload(0, i, 24))).ok());
    ring.read([](int32_t, std::span<const std::byte>) {});
  }
  uint32_t written = 0;
  while (ring.try_write(1, as_bytes(make_payload(0, 1000 + written, 24))).ok())
    ++written;
  ASSERT_GT(written, 0u);
  mem.as<MpscRingHeader>()->head_cache.store(
      0);  // as a long-descheduled producer would have left it
  EXPECT_EQ(ring.try_write(1, as_bytes(make_payload(0, 9999, 24))).code(), Errc::kFull);
  uint32_t next = 1000;
  ring.read([&](int32_t, std::span<const std::byte> p) {
    uint32_t producer = 0, seq = 0;
    ASSERT_TRUE(payload_intact(p, producer, seq));
    EXPECT_EQ(seq, next++) << "nothing was overwritten";
  });
  EXPECT_EQ(next, 1000 + written);
}

TEST(MpscRing, BlockingWriteOnAFullRingWaitsThenTimesOut) {
  SharedRegion mem(MpscRing::bytes_for(256));
  auto ring = make_ring(mem, 256);
  while (ring.try_write(1, as_bytes(make_payload(0, 0, 24))).ok()) {
  }
  Status s = ring.write(1, as_bytes(make_payload(0, 0, 24)), Deadline::after(30ms));
  EXPECT_EQ(s.code(), Errc::kTimeout);
}

TEST(MpscRing, BlockingWriteProceedsOnceTheConsumerMakesRoom) {
  SharedRegion mem(MpscRing::bytes_for(256));
  auto ring = make_ring(mem, 256);
  while (ring.try_write(1, as_bytes(make_payload(0, 0, 24))).ok()) {
  }
  const pid_t consumer = testing::fork_child([&] {
    usleep(20'000);
    return ring.read([](int32_t, std::span<const std::byte>) {}, 1) == 1 ? 0 : 1;
  });
  Status s = ring.write(1, as_bytes(make_payload(0, 0, 24)), Deadline::after(10s));
  EXPECT_TRUE(s.ok()) << s.error().message;
  auto exit = testing::wait_child(consumer, 10s);
  ASSERT_TRUE(exit && exit->exited);
  EXPECT_EQ(exit->code, 0);
}

TEST(MpscRing, OversizedRecordIsRefusedWithItsSizeAndTheLimit) {
  SharedRegion mem(MpscRing::bytes_for(1024));
  auto ring = make_ring(mem, 1024);
  std::vector<std::byte> big(ring.max_payload_bytes() + 1);
  Status s = ring.try_write(1, as_bytes(big));
  ASSERT_EQ(s.code(), Errc::kTooLarge);
  EXPECT_NE(s.error().message.find(std::to_string(big.size())), std::string::npos);
  EXPECT_NE(s.error().message.find(std::to_string(ring.max_payload_bytes())), std::string::npos);
}

TEST(MpscRing, AbortedClaimIsSkippedAndLaterRecordsArrive) {
  SharedRegion mem(MpscRing::bytes_for(1024));
  auto ring = make_ring(mem, 1024);
  auto c = ring.try_claim(40);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(ring.try_write(7, as_bytes(make_payload(0, 1, 16))).ok());
  ring.abort(*c);
  std::vector<int32_t> types;
  ring.read([&](int32_t type, std::span<const std::byte>) { types.push_back(type); });
  EXPECT_EQ(types, std::vector<int32_t>{7});
}

TEST(MpscRing, AttachRefusesCorruptGeometry) {
  SharedRegion mem(MpscRing::bytes_for(1024));
  make_ring(mem, 1024);
  mem.as<MpscRingHeader>()->capacity = 1000;
  EXPECT_EQ(MpscRing::attach(mem.data(), mem.size()).code(), Errc::kCorrupt);
  mem.as<MpscRingHeader>()->capacity = 4096;  // larger than the region
  EXPECT_EQ(MpscRing::attach(mem.data(), mem.size()).code(), Errc::kCorrupt);
}

TEST(MpscRing, ImpossibleLengthWrittenBehindTheRingsBackIsCountedAndSkippedSafely) {
  SharedRegion mem(MpscRing::bytes_for(1024));
  auto ring = make_ring(mem, 1024);
  ASSERT_TRUE(ring.try_write(1, as_bytes(make_payload(0, 0, 16))).ok());
  // Scribble: a record claiming to be far longer than the ring.
  auto* first = reinterpret_cast<MpscRecordHeader*>(reinterpret_cast<std::byte*>(mem.data()) +
                                                    sizeof(MpscRingHeader));
  first->length.store(1 << 20);
  size_t handed = 0;
  ring.read([&](int32_t, std::span<const std::byte>) { ++handed; });
  EXPECT_EQ(handed, 0u);
  EXPECT_EQ(ring.header().corrupt_records.load(), 1u);
  ASSERT_TRUE(ring.try_write(1, as_bytes(make_payload(0, 5, 16))).ok());
  ring.read([&](int32_t, std::span<const std::byte>) { ++handed; });
  EXPECT_EQ(handed, 1u) << "the ring keeps working after the corrupt stretch";
}

// N producer processes x M records each into one consumer: every record
// arrives exactly once, each producer's records in its order, bytes intact.
TEST(MpscRingProcesses, ManyProducersEveryRecordExactlyOncePerProducerOrderIntact) {
  constexpr uint32_t kProducers = 4;
  constexpr uint32_t kPerProducer = 50'000;
  SharedRegion mem(MpscRing::bytes_for(16384));
  auto ring = make_ring(mem, 16384);

  std::vector<pid_t> producers;
  for (uint32_t p = 0; p < kProducers; ++p) {
    producers.push_back(testing::fork_child([&, p] {
      for (uint32_t i = 0; i < kPerProducer; ++i) {
        const size_t len = 8 + (i * 7 + p) % 57;
        if (!ring.write(int32_t(p + 1), as_bytes(make_payload(p, i, len)), Deadline::after(30s))
                 .ok())
          return 2;
      }
      return 0;
    }));
  }

  std::vector<uint32_t> next(kProducers, 0);
  uint64_t out_of_order = 0, damaged = 0, total = 0;
  const Deadline give_up = Deadline::after(60s);
  while (total < uint64_t{kProducers} * kPerProducer && !give_up.passed()) {
    total += ring.read_wait(
        [&](int32_t type, std::span<const std::byte> p) {
          uint32_t producer = 0, seq = 0;
          if (!payload_intact(p, producer, seq) || producer >= kProducers ||
              type != int32_t(producer + 1) || p.size() != 8 + (seq * 7 + producer) % 57) {
            ++damaged;
            return;
          }
          if (seq != next[producer]) ++out_of_order;
          next[producer] = seq + 1;
        },
        SIZE_MAX, Deadline::after(1s));
  }
  for (pid_t pid : producers) {
    auto exit = testing::wait_child(pid, 30s);
    ASSERT_TRUE(exit && exit->exited);
    EXPECT_EQ(exit->code, 0);
  }
  EXPECT_EQ(total, uint64_t{kProducers} * kPerProducer);
  EXPECT_EQ(damaged, 0u);
  EXPECT_EQ(out_of_order, 0u);
  for (uint32_t p = 0; p < kProducers; ++p)
    EXPECT_EQ(next[p], kPerProducer) << "producer " << p;
  EXPECT_EQ(ring.header().skipped_records.load(), 0u);
  EXPECT_EQ(ring.header().corrupt_records.load(), 0u);
}

// A producer process claims a record and is SIGKILLed before committing it.
// The consumer skips the dead record after the stall timeout; the records
// other producers wrote before and after it all arrive.
TEST(MpscRingProcesses, RecordLeftHalfWrittenByAKilledProducerIsSkippedAndNothingElseIsLost) {
  SharedRegion mem(MpscRing::bytes_for(4096));
  auto ring = make_ring(mem, 4096);
  ring.set_stall_timeout(100ms);

  ASSERT_TRUE(ring.try_write(1, as_bytes(make_payload(0, 0, 16))).ok());
  testing::ReadyPipe claimed;
  const pid_t dying = testing::fork_child([&] {
    auto c = ring.try_claim(64);
    if (!c) return 2;
    std::memset(c->payload.data(), 0xAB, 32);  // half the payload, never committed
    claimed.signal();
    pause();
    return 0;
  });
  ASSERT_TRUE(claimed.wait(10s));
  testing::kill_child(dying);
  for (uint32_t i = 1; i <= 20; ++i)
    ASSERT_TRUE(ring.try_write(1, as_bytes(make_payload(0, i, 16))).ok());

  std::vector<uint32_t> seqs;
  const Deadline give_up = Deadline::after(10s);
  while (seqs.size() < 21 && !give_up.passed()) {
    ring.read_wait(
        [&](int32_t, std::span<const std::byte> p) {
          uint32_t producer = 0, seq = 0;
          ASSERT_TRUE(payload_intact(p, producer, seq));
          seqs.push_back(seq);
        },
        SIZE_MAX, Deadline::after(1s));
  }
  ASSERT_EQ(seqs.size(), 21u);
  for (uint32_t i = 0; i < 21; ++i)
    EXPECT_EQ(seqs[i], i);
  EXPECT_EQ(ring.header().skipped_records.load(), 1u);
}

// The narrowest window: claimed (tail moved) but not even the header written.
// Simulated by a claim whose header we then zero, as a producer killed right
// after its CAS would leave it.
TEST(MpscRing, ClaimWithNoHeaderWrittenIsSkippedAfterTheTimeout) {
  SharedRegion mem(MpscRing::bytes_for(1024));
  auto ring = make_ring(mem, 1024);
  ring.set_stall_timeout(20ms);
  auto c = ring.try_claim(24);
  ASSERT_TRUE(c.ok());
  auto* rec = reinterpret_cast<MpscRecordHeader*>(c->payload.data() - 8);
  rec->length.store(0);
  rec->type.store(0);
  ASSERT_TRUE(ring.try_write(3, as_bytes(make_payload(0, 1, 16))).ok());
  std::vector<int32_t> types;
  const Deadline give_up = Deadline::after(5s);
  while (types.empty() && !give_up.passed()) {
    ring.read_wait([&](int32_t t, std::span<const std::byte>) { types.push_back(t); }, SIZE_MAX,
                   Deadline::after(100ms));
  }
  EXPECT_EQ(types, std::vector<int32_t>{3});
  EXPECT_EQ(ring.header().skipped_records.load(), 1u);
}

// A live producer that is merely slow is not robbed of its record at the
// first timeout: only a dead one is skipped that early.
TEST(MpscRing, InProgressRecordOfALiveProducerIsNotSkippedAtTheFirstTimeout) {
  SharedRegion mem(MpscRing::bytes_for(1024));
  auto ring = make_ring(mem, 1024);
  ring.set_stall_timeout(200ms);
  auto c = ring.try_claim(16);  // in progress, by this (live) process
  ASSERT_TRUE(c.ok());
  ring.read([](int32_t, std::span<const std::byte>) {});
  usleep(250'000);  // past 1x the timeout, well short of 4x
  ring.read([](int32_t, std::span<const std::byte>) {});
  EXPECT_EQ(ring.header().skipped_records.load(), 0u);
  std::memset(c->payload.data(), 1, 16);
  ring.commit(*c, 9);
  std::vector<int32_t> types;
  ring.read([&](int32_t t, std::span<const std::byte>) { types.push_back(t); });
  EXPECT_EQ(types, std::vector<int32_t>{9});
}

}  // namespace
}  // namespace kvrelay
