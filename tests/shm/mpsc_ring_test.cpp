// MpscRing: functional behaviour, many producer processes into one consumer,
// backpressure, producers that die or pause mid-record (stopped at exact
// instructions by fault points), and shared state scribbled on by a process
// that bypasses the ring.
#include "shm/mpsc_ring.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "shm/fault_point.h"
#include "support/processes.h"

namespace kvrelay {
namespace {

using testing::SharedFileRegion;
using namespace std::chrono_literals;

// A ring in file-backed shared memory: its producers' owner locks work, and
// forked children can be producers of their own.
struct MpscTestRing {
  explicit MpscTestRing(uint64_t capacity) : mem(MpscRing::bytes_for(capacity)) {
    EXPECT_TRUE(MpscRing::initialize(mem.data(), mem.size(), capacity,
                                     MpscRing::default_max_payload(capacity))
                    .ok());
  }
  // This process's view (the consumer's, or a producer's).
  MpscRing attach() { return MpscRing::attach(mem.data(), mem.size(), mem.locks()).value(); }
  MpscProducer producer() {
    auto p = attach().lease_producer();
    EXPECT_TRUE(p.ok()) << p.error().message;
    return std::move(p).value();
  }
  MpscRingHeader& header() { return *mem.as<MpscRingHeader>(); }
  std::atomic<uint64_t>& word_at(uint64_t offset) {
    return *reinterpret_cast<std::atomic<uint64_t>*>(static_cast<std::byte*>(mem.data()) +
                                                     sizeof(MpscRingHeader) + offset);
  }
  SharedFileRegion mem;
};

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

// Reads until `want` records arrived or `within` passed; returns (producer, seq) pairs.
std::vector<std::pair<uint32_t, uint32_t>> collect(MpscRing& ring, size_t want,
                                                   std::chrono::milliseconds within) {
  std::vector<std::pair<uint32_t, uint32_t>> got;
  const Deadline give_up = Deadline::after(within);
  while (got.size() < want && !give_up.passed()) {
    ring.read_wait(
        [&](const MpscRecord& r) {
          uint32_t producer = 0, seq = 0;
          EXPECT_TRUE(payload_intact(r.payload, producer, seq));
          got.emplace_back(producer, seq);
        },
        SIZE_MAX, Deadline::after(50ms));
  }
  return got;
}

TEST(MpscRing, RecordsOfOddSizesComeOutInOrderAcrossWrapArounds) {
  MpscTestRing t(1024);
  MpscRing ring = t.attach();
  MpscProducer producer = t.producer();
  uint32_t next_write = 0;
  uint32_t next_read = 0;
  size_t wraps_with_padding = 0;
  for (int round = 0; round < 2000; ++round) {
    // Lengths 8..120, none a multiple of the 8-byte alignment after the header.
    const size_t len = 8 + (next_write * 13) % 113;
    const uint64_t tail_before = t.header().tail.load();
    if (producer.try_write(1 + int32_t(next_write % 5), as_bytes(make_payload(0, next_write, len)))
            .ok()) {
      const uint64_t advanced = t.header().tail.load() - tail_before;
      if (advanced > ((8 + len + 7) & ~size_t{7})) ++wraps_with_padding;
      ++next_write;
    }
    if (round % 3 != 0) {
      ring.read(
          [&](const MpscRecord& r) {
            uint32_t p = 0, seq = 0;
            ASSERT_TRUE(payload_intact(r.payload, p, seq));
            ASSERT_EQ(seq, next_read);
            ASSERT_EQ(r.type, 1 + int32_t(seq % 5));
            ASSERT_EQ(r.payload.size(), 8 + (seq * 13) % 113);
            ASSERT_EQ(r.producer, producer.slot());
            ++next_read;
          },
          2);
    }
  }
  ring.read([&](const MpscRecord& r) {
    uint32_t p = 0, seq = 0;
    ASSERT_TRUE(payload_intact(r.payload, p, seq));
    ASSERT_EQ(seq, next_read++);
  });
  EXPECT_EQ(next_read, next_write);
  EXPECT_GT(next_write, 1000u);
  EXPECT_GT(wraps_with_padding, 10u) << "the test must exercise padding records at the wrap";
}

TEST(MpscRing, FullRingRefusesTryWriteAndNeverOverwrites) {
  MpscTestRing t(256);
  MpscRing ring = t.attach();
  MpscProducer producer = t.producer();
  uint32_t written = 0;
  while (producer.try_write(1, as_bytes(make_payload(0, written, 24))).ok())
    ++written;
  EXPECT_EQ(written, 256u / 32u);  // 8-byte header + 24 bytes each
  Status s = producer.try_write(1, as_bytes(make_payload(0, 99, 24)));
  EXPECT_EQ(s.code(), Errc::kFull);
  EXPECT_GE(t.header().full_events.load(), 1u);
  uint32_t next = 0;
  ring.read([&](const MpscRecord& r) {
    uint32_t p = 0, seq = 0;
    ASSERT_TRUE(payload_intact(r.payload, p, seq));
    EXPECT_EQ(seq, next++);
  });
  EXPECT_EQ(next, written);
}

// Regression: a producer's cached head more than a lap behind the tail made
// the free space computation wrap around, and a full ring looked empty.
TEST(MpscRing, HeadCacheALapBehindStillSeesAFullRing) {
  MpscTestRing t(256);
  MpscRing ring = t.attach();
  MpscProducer producer = t.producer();
  for (uint32_t i = 0; i < 100; ++i) {  // go round the ring many times
    ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, i, 24))).ok());
    ring.read([](const MpscRecord&) {});
  }
  uint32_t written = 0;
  while (producer.try_write(1, as_bytes(make_payload(0, 1000 + written, 24))).ok())
    ++written;
  ASSERT_GT(written, 0u);
  t.header().head_cache.store(0);  // as a long-descheduled producer would have left it
  EXPECT_EQ(producer.try_write(1, as_bytes(make_payload(0, 9999, 24))).code(), Errc::kFull);
  uint32_t next = 1000;
  ring.read([&](const MpscRecord& r) {
    uint32_t p = 0, seq = 0;
    ASSERT_TRUE(payload_intact(r.payload, p, seq));
    EXPECT_EQ(seq, next++) << "nothing was overwritten";
  });
  EXPECT_EQ(next, 1000 + written);
}

TEST(MpscRing, BlockingWriteOnAFullRingWaitsThenTimesOut) {
  MpscTestRing t(256);
  MpscProducer producer = t.producer();
  while (producer.try_write(1, as_bytes(make_payload(0, 0, 24))).ok()) {
  }
  Status s = producer.write(1, as_bytes(make_payload(0, 0, 24)), Deadline::after(30ms));
  EXPECT_EQ(s.code(), Errc::kTimeout);
}

TEST(MpscRing, BlockingWriteProceedsOnceTheConsumerMakesRoom) {
  MpscTestRing t(256);
  MpscProducer producer = t.producer();
  while (producer.try_write(1, as_bytes(make_payload(0, 0, 24))).ok()) {
  }
  const pid_t consumer = testing::fork_child([&] {
    usleep(20'000);
    MpscRing ring = t.attach();
    return ring.read([](const MpscRecord&) {}, 1) == 1 ? 0 : 1;
  });
  Status s = producer.write(1, as_bytes(make_payload(0, 0, 24)), Deadline::after(10s));
  EXPECT_TRUE(s.ok()) << s.error().message;
  auto exit = testing::wait_child(consumer, 10s);
  ASSERT_TRUE(exit && exit->exited);
  EXPECT_EQ(exit->code, 0);
}

TEST(MpscRing, OversizedRecordIsRefusedWithItsSizeAndTheLimit) {
  MpscTestRing t(1024);
  MpscProducer producer = t.producer();
  std::vector<std::byte> big(producer.max_payload_bytes() + 1);
  Status s = producer.try_write(1, as_bytes(big));
  ASSERT_EQ(s.code(), Errc::kTooLarge);
  EXPECT_NE(s.error().message.find(std::to_string(big.size())), std::string::npos);
  EXPECT_NE(s.error().message.find(std::to_string(producer.max_payload_bytes())),
            std::string::npos);
}

TEST(MpscRing, RecordGivenUpWhileBeingWrittenBecomesPaddingAndLaterRecordsArrive) {
  MpscTestRing t(1024);
  MpscRing ring = t.attach();
  MpscProducer producer = t.producer();
  Status s = producer.write_with(
      7, 40, [](std::span<std::byte>) { return false; }, Deadline::now());
  EXPECT_EQ(s.code(), Errc::kInvalidArgument);
  ASSERT_TRUE(producer.try_write(8, as_bytes(make_payload(0, 1, 16))).ok());
  std::vector<int32_t> types;
  ring.read([&](const MpscRecord& r) { types.push_back(r.type); });
  EXPECT_EQ(types, std::vector<int32_t>{8});
}

TEST(MpscRing, AttachRefusesCorruptGeometry) {
  MpscTestRing t(1024);
  t.header().capacity = 1000;
  EXPECT_EQ(MpscRing::attach(t.mem.data(), t.mem.size()).code(), Errc::kCorrupt);
  t.header().capacity = 4096;  // larger than the region
  EXPECT_EQ(MpscRing::attach(t.mem.data(), t.mem.size()).code(), Errc::kCorrupt);
}

TEST(MpscRing, EveryLeaseIsItsOwnSlotAndAReleasedSlotIsReusedWithANewGeneration) {
  MpscTestRing t(1024);
  MpscProducer a = t.producer();
  MpscProducer b = t.producer();
  EXPECT_NE(a.slot(), b.slot());
  const uint32_t slot = a.slot();
  const uint32_t generation = a.generation();
  MpscRing ring = t.attach();
  a.release();
  EXPECT_EQ(ring.session_state(slot, generation), ProducerSession::kReleased);
  MpscProducer c = t.producer();
  EXPECT_EQ(c.slot(), slot);
  EXPECT_EQ(c.generation(), generation + 1);
  EXPECT_EQ(ring.session_state(slot, generation), ProducerSession::kReleased)
      << "the clean release of the old session is still known";
}

TEST(MpscRingProcesses, ASessionWhoseProcessDiedIsJudgedDeadByItsLock) {
  MpscTestRing t(1024);
  testing::ReadyPipe leased;
  std::atomic<uint32_t>* shared = t.mem.as<std::atomic<uint32_t>>() + 8;  // scratch in reserved1
  const pid_t child = testing::fork_child([&] {
    MpscProducer p = t.producer();
    shared->store((p.slot() << 16) | p.generation());
    leased.signal();
    pause();
    return 0;
  });
  ASSERT_TRUE(leased.wait(10s));
  const uint32_t id = shared->load();
  MpscRing ring = t.attach();
  EXPECT_EQ(ring.session_state(id >> 16, id & 0xffff), ProducerSession::kAlive);
  testing::kill_child(child);
  EXPECT_EQ(ring.session_state(id >> 16, id & 0xffff), ProducerSession::kDead);
}

// A reader that loses the race for the consumer's lease, just after the
// winner took its lock and before the winner wrote its pid, is told who
// reads once the pid is there, never "pid 0" (CI saw that once).
TEST(MpscRingProcesses, ALoserOfTheReadersRaceIsToldTheWinnersPidNotZero) {
  MpscTestRing t(1024);
  const pid_t winner = testing::fork_child([&] {
    fault::arm("mpsc.consumer_locked", fault::Action::kStop);
    Result<MpscConsumerLease> lease = t.attach().lease_consumer(0x5eed);
    if (!lease) return 2;
    pause();
    return 0;
  });
  int status = 0;
  ASSERT_EQ(waitpid(winner, &status, WUNTRACED), winner);
  ASSERT_TRUE(WIFSTOPPED(status)) << "stopped between its lock and its pid";
  MpscRing ring = t.attach();
  Result<MpscConsumerLease> early = ring.lease_consumer(1);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.code(), Errc::kBusy);
  EXPECT_EQ(early.error().message.find("pid 0"), std::string::npos) << early.error().message;

  // The winner writes its pid while the loser waits for it.
  std::thread resume([&] {
    std::this_thread::sleep_for(20ms);
    kill(winner, SIGCONT);
  });
  Result<MpscConsumerLease> later = ring.lease_consumer(1);
  resume.join();
  ASSERT_FALSE(later.ok());
  EXPECT_NE(later.error().message.find("pid " + std::to_string(winner)), std::string::npos)
      << later.error().message;
  EXPECT_NE(later.error().message.find("session 00005eed"), std::string::npos)
      << later.error().message;
  testing::kill_child(winner);
}

// N producer processes x M records each into one consumer: every record
// arrives exactly once, each producer's records in its order, bytes intact.
TEST(MpscRingProcesses, ManyProducersEveryRecordExactlyOncePerProducerOrderIntact) {
  constexpr uint32_t kProducers = 4;
  constexpr uint32_t kPerProducer = 50'000;
  MpscTestRing t(16384);
  std::vector<pid_t> producers;
  for (uint32_t p = 0; p < kProducers; ++p) {
    producers.push_back(testing::fork_child([&, p] {
      MpscProducer producer = t.producer();
      for (uint32_t i = 0; i < kPerProducer; ++i) {
        const size_t len = 8 + (i * 7 + p) % 57;
        if (!producer.write(int32_t(p + 1), as_bytes(make_payload(p, i, len)), Deadline::after(30s))
                 .ok())
          return 2;
      }
      return 0;
    }));
  }
  MpscRing ring = t.attach();
  std::vector<uint32_t> next(kProducers, 0);
  uint64_t out_of_order = 0, damaged = 0, total = 0;
  const Deadline give_up = Deadline::after(60s);
  while (total < uint64_t{kProducers} * kPerProducer && !give_up.passed()) {
    total += ring.read_wait(
        [&](const MpscRecord& r) {
          uint32_t producer = 0, seq = 0;
          if (!payload_intact(r.payload, producer, seq) || producer >= kProducers ||
              r.type != int32_t(producer + 1) ||
              r.payload.size() != 8 + (seq * 7 + producer) % 57) {
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
  EXPECT_EQ(t.header().skipped_records.load(), 0u);
  EXPECT_EQ(t.header().corrupt_records.load(), 0u);
}

// A producer process stops at one exact point of a record (by a fault point)
// and is then SIGKILLed or paused. Around it, another producer keeps writing.
struct StopAt {
  const char* point;
  fault::Action action;
};

class MpscDyingProducer : public ::testing::TestWithParam<StopAt> {};

// Killed mid-record (after the claim, before the header; or after the header,
// before the commit): the consumer gives the claim up once the producer's
// lock is free, and every other record arrives exactly once, in order.
TEST_P(MpscDyingProducer, KilledMidRecordCostsOnlyItsOwnRecord) {
  MpscTestRing t(4096);
  MpscRing ring = t.attach();
  ring.set_stall_timeout(50ms);
  MpscProducer mine = t.producer();
  ASSERT_TRUE(mine.try_write(1, as_bytes(make_payload(0, 0, 16))).ok());
  const pid_t dying = testing::fork_child([&] {
    MpscProducer p = t.producer();
    fault::arm(GetParam().point, fault::Action::kKill);
    (void)p.try_write(2, as_bytes(make_payload(1, 0, 64)));
    return 3;  // not reached
  });
  auto exit = testing::wait_child(dying, 10s);
  ASSERT_TRUE(exit.has_value());
  ASSERT_EQ(exit->signal, SIGKILL) << "the fault point must have stopped it mid-record";
  for (uint32_t i = 1; i <= 20; ++i)
    ASSERT_TRUE(mine.try_write(1, as_bytes(make_payload(0, i, 16))).ok());
  const auto got = collect(ring, 21, 10s);
  ASSERT_EQ(got.size(), 21u);
  for (uint32_t i = 0; i < 21; ++i)
    EXPECT_EQ(got[i], std::make_pair(0u, i));
  EXPECT_EQ(t.header().skipped_records.load(), 1u);
}

// Paused mid-record for many stall timeouts (SIGSTOP, as a debugger or the
// cgroup freezer would): its record is not given up, nothing is corrupted,
// and once it resumes every record arrives exactly once, in order.
TEST_P(MpscDyingProducer, PausedMidRecordLosesNothing) {
  MpscTestRing t(4096);
  MpscRing ring = t.attach();
  ring.set_stall_timeout(20ms);
  MpscProducer mine = t.producer();
  ASSERT_TRUE(mine.try_write(1, as_bytes(make_payload(0, 0, 16))).ok());
  const pid_t paused = testing::fork_child([&] {
    MpscProducer p = t.producer();
    fault::arm(GetParam().point, fault::Action::kStop);
    if (!p.try_write(2, as_bytes(make_payload(1, 0, 64))).ok()) return 2;
    if (!p.try_write(2, as_bytes(make_payload(1, 1, 64))).ok()) return 3;
    return 0;
  });
  int status = 0;
  ASSERT_EQ(waitpid(paused, &status, WUNTRACED), paused);
  ASSERT_TRUE(WIFSTOPPED(status));
  for (uint32_t i = 1; i <= 10; ++i)
    ASSERT_TRUE(mine.try_write(1, as_bytes(make_payload(0, i, 16))).ok());
  // 50 stall timeouts: the old ring gave a live producer's record up after 4.
  const auto before = collect(ring, 12, 1s);
  EXPECT_EQ(before.size(), 1u) << "only the record before the paused claim can be read";
  EXPECT_EQ(t.header().skipped_records.load(), 0u);
  kill(paused, SIGCONT);
  auto exit = testing::wait_child(paused, 10s);
  ASSERT_TRUE(exit && exit->exited);
  EXPECT_EQ(exit->code, 0) << "the paused producer's writes must succeed";
  const auto after = collect(ring, 12, 10s);
  std::vector<std::pair<uint32_t, uint32_t>> want;
  for (uint32_t i = 1; i <= 10; ++i)
    want.emplace_back(0, i);
  // The paused record sits where it was claimed: before ours that followed.
  ASSERT_EQ(after.size(), 12u);
  EXPECT_EQ(after.front(), std::make_pair(1u, 0u));
  std::vector<std::pair<uint32_t, uint32_t>> ours(after.begin() + 1, after.end() - 1);
  EXPECT_EQ(ours, want);
  EXPECT_EQ(after.back(), std::make_pair(1u, 1u));
  EXPECT_EQ(t.header().skipped_records.load(), 0u);
  EXPECT_EQ(t.header().corrupt_events.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Points, MpscDyingProducer,
                         ::testing::Values(StopAt{"mpsc.claimed", fault::Action::kKill},
                                           StopAt{"mpsc.written", fault::Action::kKill}),
                         [](const auto& point) {
                           return std::string(point.param.point) == "mpsc.claimed"
                                      ? "AfterClaimBeforeHeader"
                                      : "AfterHeaderBeforeCommit";
                         });

TEST(MpscRing, ACommitAfterTheRecordWasGivenUpIsAnErrorNotASuccess) {
  MpscTestRing t(1024);
  MpscRing ring = t.attach();
  MpscProducer producer = t.producer();
  auto claim = producer.claim_for_test(24);
  ASSERT_TRUE(claim.ok());
  // What a consumer that judged the producer dead does: the header becomes padding.
  uint64_t expected = claim->in_progress;
  ASSERT_TRUE(
      t.word_at(claim->offset)
          .compare_exchange_strong(expected, mpsc_header::pack(32, mpsc_header::kPaddingType,
                                                               mpsc_header::kNoProducer, 0)));
  Status s = producer.commit_for_test(*claim, 5);
  EXPECT_EQ(s.code(), Errc::kAborted);
  EXPECT_EQ(ring.read([](const MpscRecord&) {}), 0u) << "nothing is delivered for it";
  ASSERT_TRUE(producer.try_write(6, as_bytes(make_payload(0, 1, 16))).ok());
  std::vector<int32_t> types;
  ring.read([&](const MpscRecord& r) { types.push_back(r.type); });
  EXPECT_EQ(types, std::vector<int32_t>{6});
}

// ---- shared state written behind the ring's back ----

TEST(MpscRingScribbled, ARecordLongerThanTheLimitButWithinItsBoundsCostsOnlyItself) {
  MpscTestRing t(4096);
  MpscRing ring = t.attach();
  MpscProducer producer = t.producer();
  ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, 0, 16))).ok());
  const uint64_t big_at = t.header().tail.load();
  // A scribbler writes a committed record of 1000 bytes (the limit is 504).
  ASSERT_TRUE(producer.try_write(1, as_bytes(std::vector<std::byte>(500))).ok());
  t.word_at(big_at).store(mpsc_header::pack(1000, 1, 0, 0));
  t.header().tail.store(big_at + 1000);
  ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, 2, 16))).ok());
  std::vector<uint32_t> seqs;
  size_t defects = 0;
  ring.read([&](const MpscRecord& r) {
    if (r.defect != nullptr) {
      ++defects;
      return;
    }
    uint32_t p = 0, seq = 0;
    ASSERT_TRUE(payload_intact(r.payload, p, seq));
    seqs.push_back(seq);
  });
  EXPECT_EQ(defects, 1u);
  EXPECT_EQ(seqs, (std::vector<uint32_t>{0, 2})) << "the record after it still arrives";
  EXPECT_EQ(t.header().corrupt_records.load(), 1u);
  EXPECT_FALSE(ring.corrupt());
}

TEST(MpscRingScribbled, ALengthReachingPastTheTailStopsTheConsumerThereAndMarksTheRingCorrupt) {
  MpscTestRing t(4096);
  MpscRing ring = t.attach();
  MpscProducer producer = t.producer();
  ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, 0, 16))).ok());
  const uint64_t at = t.header().tail.load();
  ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, 1, 16))).ok());
  t.word_at(at).store(mpsc_header::pack(400, 1, 0, 0));  // 8 bytes written at a record's head
  size_t handed = 0;
  ring.read([&](const MpscRecord&) { ++handed; });
  EXPECT_EQ(handed, 1u) << "the record before it arrives";
  EXPECT_TRUE(ring.corrupt());
  EXPECT_LE(t.header().head.load(), t.header().tail.load()) << "head never passes the tail";
  auto what = ring.take_corruption();
  ASSERT_TRUE(what.has_value());
  EXPECT_NE(what->find("cannot be delimited"), std::string::npos) << *what;
}

TEST(MpscRingScribbled, AHeaderLeftAtTheHeadOfAnEmptyRingIsNotReadAndNotSpunOn) {
  MpscTestRing t(4096);
  MpscRing ring = t.attach();
  MpscProducer producer = t.producer();
  ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, 0, 16))).ok());
  ring.read([](const MpscRecord&) {});
  const uint64_t head = t.header().head.load();
  t.word_at(head & 4095).store(mpsc_header::pack(24, 1, 0, 0));
  EXPECT_FALSE(ring.readable()) << "a consumer must not wake up for it";
  EXPECT_EQ(ring.read([](const MpscRecord&) {}), 0u);
  EXPECT_EQ(t.header().corrupt_records.load(), 0u);
  // The next real record overwrites it.
  ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, 1, 16))).ok());
  std::vector<uint32_t> seqs;
  ring.read([&](const MpscRecord& r) {
    uint32_t p = 0, seq = 0;
    ASSERT_TRUE(payload_intact(r.payload, p, seq));
    seqs.push_back(seq);
  });
  EXPECT_EQ(seqs, std::vector<uint32_t>{1});
}

// The same stray header, met by a producer stopped between its tail CAS
// and its in-progress header: the consumer must not take the stray header
// for that record (it did under TSan's timing, and then lost the record).
TEST(MpscRingScribbled, AStrayHeaderIsClearedBeforeAClaimCoversIt) {
  MpscTestRing t(4096);
  MpscRing ring = t.attach();
  ring.set_stall_timeout(20ms);
  MpscProducer mine = t.producer();
  ASSERT_TRUE(mine.try_write(1, as_bytes(make_payload(0, 0, 16))).ok());
  ASSERT_EQ(collect(ring, 1, 1s).size(), 1u);
  const uint64_t head = t.header().head.load();
  t.word_at(head & 4095).store(mpsc_header::pack(24, 1, 0, 0));
  const pid_t paused = testing::fork_child([&] {
    MpscProducer p = t.producer();
    fault::arm("mpsc.claimed", fault::Action::kStop);
    return p.try_write(2, as_bytes(make_payload(1, 0, 64))).ok() ? 0 : 2;
  });
  int status = 0;
  ASSERT_EQ(waitpid(paused, &status, WUNTRACED), paused);
  ASSERT_TRUE(WIFSTOPPED(status));
  EXPECT_GT(t.header().tail.load(), head) << "stopped after its claim";
  EXPECT_EQ(collect(ring, 1, 300ms).size(), 0u) << "nothing is committed yet";
  EXPECT_EQ(t.header().corrupt_events.load(), 1u) << "the stray header is counted";
  kill(paused, SIGCONT);
  auto exit = testing::wait_child(paused, 10s);
  ASSERT_TRUE(exit && exit->exited);
  EXPECT_EQ(exit->code, 0);
  const auto got = collect(ring, 1, 5s);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], std::make_pair(1u, 0u));
  EXPECT_EQ(t.header().skipped_records.load(), 0u);
  EXPECT_EQ(t.header().corrupt_records.load(), 0u);
}

TEST(MpscRingScribbled, AnImpossibleTailIsRebuiltFromTheRecordsAndNothingIsLost) {
  for (uint64_t bad : {uint64_t{3}, uint64_t{1} << 40}) {  // misaligned; far ahead
    MpscTestRing t(4096);
    MpscRing ring = t.attach();
    MpscProducer producer = t.producer();
    for (uint32_t i = 0; i < 3; ++i)
      ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, i, 16))).ok());
    const uint64_t real = t.header().tail.load();
    t.header().tail.store(bad == 3 ? real + 3 : real + bad);
    EXPECT_EQ(producer.try_write(1, as_bytes(make_payload(0, 9, 16))).code(), Errc::kCorrupt)
        << "a producer writes nothing into an impossible ring";
    std::vector<uint32_t> seqs;
    ring.read([&](const MpscRecord& r) {
      uint32_t p = 0, seq = 0;
      ASSERT_TRUE(payload_intact(r.payload, p, seq));
      seqs.push_back(seq);
    });
    EXPECT_EQ(seqs, (std::vector<uint32_t>{0, 1, 2}));
    EXPECT_EQ(t.header().tail.load(), real);
    EXPECT_TRUE(ring.take_corruption().has_value());
    ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, 3, 16))).ok());
    EXPECT_EQ(ring.read([](const MpscRecord&) {}), 1u) << "the ring works again";
  }
}

TEST(MpscRingScribbled, AnOverwrittenHeadIsPutBackByTheConsumer) {
  MpscTestRing t(4096);
  MpscRing ring = t.attach();
  MpscProducer producer = t.producer();
  ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, 0, 16))).ok());
  ring.read([](const MpscRecord&) {});
  const uint64_t head = t.header().head.load();
  ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, 1, 16))).ok());
  t.header().head.store(head + 4096);  // past the tail
  std::vector<uint32_t> seqs;
  ring.read([&](const MpscRecord& r) {
    uint32_t p = 0, seq = 0;
    ASSERT_TRUE(payload_intact(r.payload, p, seq));
    seqs.push_back(seq);
  });
  EXPECT_EQ(seqs, std::vector<uint32_t>{1});
  EXPECT_TRUE(ring.take_corruption().has_value());
}

TEST(MpscRingScribbled, ASoleProducerPutsItsTailBack) {
  MpscTestRing t(4096);
  MpscRing ring = t.attach();
  MpscProducer producer = t.producer();
  producer.set_sole_producer();
  ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, 0, 16))).ok());
  const uint64_t real = t.header().tail.load();
  t.header().tail.store(real + 1);  // misaligned
  ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, 1, 16))).ok());
  EXPECT_TRUE(producer.take_corruption().has_value());
  std::vector<uint32_t> seqs;
  ring.read([&](const MpscRecord& r) {
    uint32_t p = 0, seq = 0;
    ASSERT_TRUE(payload_intact(r.payload, p, seq));
    seqs.push_back(seq);
  });
  EXPECT_EQ(seqs, (std::vector<uint32_t>{0, 1}));
}

TEST(MpscRing, ResetDropsEverythingAndTheRingWorksAfterwards) {
  MpscTestRing t(4096);
  MpscRing ring = t.attach();
  MpscProducer producer = t.producer();
  producer.set_sole_producer();
  for (uint32_t i = 0; i < 5; ++i)
    ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, i, 16))).ok());
  EXPECT_GT(producer.reset_ring(), 0u);
  MpscRing next_consumer = t.attach();
  EXPECT_EQ(next_consumer.read([](const MpscRecord&) {}), 0u);
  ASSERT_TRUE(producer.try_write(1, as_bytes(make_payload(0, 9, 16))).ok());
  std::vector<uint32_t> seqs;
  next_consumer.read([&](const MpscRecord& r) {
    uint32_t p = 0, seq = 0;
    ASSERT_TRUE(payload_intact(r.payload, p, seq));
    seqs.push_back(seq);
  });
  EXPECT_EQ(seqs, std::vector<uint32_t>{9});
  EXPECT_FALSE(producer.take_corruption().has_value()) << "a reset is not a scribble";
}

}  // namespace
}  // namespace kvrelay
