// Ring throughput across processes, ours against a baseline, side by side:
//
//   SPSC:  kvrelay SpscRing  vs  boost::lockfree::spsc_queue, both placed in
//          the same Boost.Interprocess segment, same record size, a producer
//          process and a consumer process spinning on try_push / try_pop.
//   MPSC:  kvrelay MpscRing  vs  boost::interprocess::message_queue, 1 and 2
//          producer processes into one consumer, blocking calls on both.
//
// Target: SPSC throughput at least 2x Boost.Lockfree's.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <boost/interprocess/ipc/message_queue.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <boost/lockfree/spsc_queue.hpp>
#include <cstring>
#include <new>

#include "bench_support.h"
#include "shm/clock.h"
#include "shm/mpsc_ring.h"
#include "shm/spsc_ring.h"
#include "shm/command_line.h"

namespace bip = boost::interprocess;
using namespace kvrelay;
using namespace kvrelay::bench;

namespace {

constexpr uint32_t kSpscCapacity = 4096;

template <size_t N>
struct Rec {
  uint64_t seq;
  uint8_t body[N - 8];
};

// Start/stop timestamps written by the two sides.
struct alignas(64) Timing {
  std::atomic<uint32_t> go{0};
  std::atomic<uint64_t> start_ns{0};
  std::atomic<uint64_t> end_ns{0};
  std::atomic<uint64_t> errors{0};
};

// A Boost.Interprocess segment holding the timing block and one queue.
class BenchSegment {
 public:
  explicit BenchSegment(size_t bytes) : name_(fmt::format("kvrelay-bench-{}", getpid())) {
    bip::shared_memory_object::remove(name_.c_str());
    shm_ = bip::shared_memory_object(bip::create_only, name_.c_str(), bip::read_write);
    shm_.truncate(static_cast<bip::offset_t>(bytes + 4096));
    region_ = bip::mapped_region(shm_, bip::read_write);
    timing_ = new (region_.get_address()) Timing{};
  }
  ~BenchSegment() { bip::shared_memory_object::remove(name_.c_str()); }
  Timing& timing() { return *timing_; }
  void* queue_memory() { return static_cast<char*>(region_.get_address()) + 4096; }
  size_t queue_bytes() { return region_.get_size() - 4096; }

 private:
  std::string name_;
  bip::shared_memory_object shm_;
  bip::mapped_region region_;
  Timing* timing_;
};

// Runs one producer/consumer pair. push(i) / pop(out) spin until they succeed.
template <class R, class Push, class Pop>
double run_spsc(BenchSegment& seg, uint64_t count, Push push, Pop pop) {
  Timing& t = seg.timing();
  const pid_t consumer = fork_worker([&] {
    R r{};
    uint64_t errors = 0;
    t.go.store(1);
    for (uint64_t i = 0; i < count; ++i) {
      while (!pop(r)) {
      }
      if (r.seq != i) ++errors;
    }
    t.end_ns.store(mono_now_ns());
    t.errors.store(errors);
    return 0;
  });
  while (t.go.load() == 0) {
  }
  R r{};
  std::memset(&r, 0x5a, sizeof(r));
  t.start_ns.store(mono_now_ns());
  for (uint64_t i = 0; i < count; ++i) {
    r.seq = i;
    while (!push(r)) {
    }
  }
  if (!join_worker(consumer, "spsc consumer") || t.errors.load() != 0) {
    std::fprintf(stderr, "spsc: %lu records out of order\n",
                 static_cast<unsigned long>(t.errors.load()));
    return 0;
  }
  return static_cast<double>(count) / (static_cast<double>(t.end_ns - t.start_ns) / 1e9) / 1e6;
}

template <size_t N>
Row bench_spsc(uint64_t count, int trials) {
  using R = Rec<N>;
  using Boost = boost::lockfree::spsc_queue<R, boost::lockfree::capacity<kSpscCapacity>>;
  std::vector<double> ours, theirs;
  for (int trial = 0; trial < trials; ++trial) {
    {
      BenchSegment seg(SpscRing<R>::bytes_for(kSpscCapacity));
      (void)SpscRing<R>::initialize(seg.queue_memory(), seg.queue_bytes(), kSpscCapacity);
      auto ring = SpscRing<R>::attach(seg.queue_memory(), seg.queue_bytes()).value();
      auto producer = ring.lease_producer().value();
      ours.push_back(run_spsc<R>(
          seg, count, [&](const R& r) { return producer.try_push(r); },
          [&](R& r) { return ring.try_pop(r); }));
    }
    {
      BenchSegment seg(sizeof(Boost));
      auto* q = new (seg.queue_memory()) Boost();
      theirs.push_back(run_spsc<R>(
          seg, count, [&](const R& r) { return q->push(r); }, [&](R& r) { return q->pop(r); }));
    }
  }
  Row row{fmt::format("spsc {}-byte records, 2 processes", N), "M/s", median(ours), median(theirs)};
  print_row(row);
  return row;
}

// ---- MPSC ----

constexpr size_t kMpscPayload = 56;  // + 8-byte header = 64-byte records
constexpr uint64_t kMpscRingBytes = 1 << 20;

double run_mpsc_ours(uint64_t per_producer, int producers) {
  BenchSegment seg(MpscRing::bytes_for(kMpscRingBytes));
  (void)MpscRing::initialize(seg.queue_memory(), seg.queue_bytes(), kMpscRingBytes,
                             MpscRing::default_max_payload(kMpscRingBytes));
  auto ring = MpscRing::attach(seg.queue_memory(), seg.queue_bytes()).value();
  Timing& t = seg.timing();
  std::vector<pid_t> kids;
  for (int p = 0; p < producers; ++p) {
    kids.push_back(fork_worker([&, p] {
      std::byte payload[kMpscPayload] = {};
      auto producer = ring.lease_producer();
      if (!producer) return 1;
      while (t.go.load() == 0) {
      }
      for (uint64_t i = 0; i < per_producer; ++i) {
        std::memcpy(payload, &i, 8);
        if (!producer->write(p + 1, payload, Deadline::after(std::chrono::seconds(30))).ok())
          return 1;
      }
      return 0;
    }));
  }
  const uint64_t total = per_producer * static_cast<uint64_t>(producers);
  uint64_t got = 0;
  std::vector<uint64_t> next(static_cast<size_t>(producers), 0);
  uint64_t errors = 0;
  t.start_ns.store(mono_now_ns());
  t.go.store(1);
  while (got < total) {
    got += ring.read_wait(
        [&](const MpscRecord& r) {
          uint64_t seq = 0;
          std::memcpy(&seq, r.payload.data(), 8);
          auto& n = next[static_cast<size_t>(r.type - 1)];
          if (seq != n) ++errors;
          n = seq + 1;
        },
        SIZE_MAX, Deadline::after(std::chrono::seconds(30)));
  }
  const uint64_t end = mono_now_ns();
  bool ok = errors == 0;
  for (pid_t k : kids)
    ok = join_worker(k, "mpsc producer") && ok;
  if (!ok) return 0;
  return static_cast<double>(total) / (static_cast<double>(end - t.start_ns) / 1e9) / 1e6;
}

double run_mpsc_boost(uint64_t per_producer, int producers) {
  const std::string name = fmt::format("kvrelay-bench-mq-{}", getpid());
  bip::message_queue::remove(name.c_str());
  const size_t max_msgs = kMpscRingBytes / (kMpscPayload + 8);
  BenchSegment seg(64);
  Timing& t = seg.timing();
  bip::message_queue mq(bip::create_only, name.c_str(), max_msgs, kMpscPayload);
  std::vector<pid_t> kids;
  for (int p = 0; p < producers; ++p) {
    kids.push_back(fork_worker([&, p] {
      bip::message_queue q(bip::open_only, name.c_str());
      char payload[kMpscPayload] = {};
      while (t.go.load() == 0) {
      }
      for (uint64_t i = 0; i < per_producer; ++i) {
        std::memcpy(payload, &i, 8);
        payload[8] = static_cast<char>(p);
        q.send(payload, sizeof(payload), 0);
      }
      return 0;
    }));
  }
  const uint64_t total = per_producer * static_cast<uint64_t>(producers);
  std::vector<uint64_t> next(static_cast<size_t>(producers), 0);
  uint64_t errors = 0;
  char buf[kMpscPayload];
  t.start_ns.store(mono_now_ns());
  t.go.store(1);
  for (uint64_t got = 0; got < total; ++got) {
    size_t received = 0;
    unsigned prio = 0;
    mq.receive(buf, sizeof(buf), received, prio);
    uint64_t seq = 0;
    std::memcpy(&seq, buf, 8);
    auto& n = next[static_cast<size_t>(buf[8])];
    if (seq != n) ++errors;
    n = seq + 1;
  }
  const uint64_t end = mono_now_ns();
  bool ok = errors == 0;
  for (pid_t k : kids)
    ok = join_worker(k, "mq producer") && ok;
  bip::message_queue::remove(name.c_str());
  if (!ok) return 0;
  return static_cast<double>(total) / (static_cast<double>(end - t.start_ns) / 1e9) / 1e6;
}

Row bench_mpsc(uint64_t per_producer, int producers, int trials) {
  std::vector<double> ours, theirs;
  for (int trial = 0; trial < trials; ++trial) {
    ours.push_back(run_mpsc_ours(per_producer, producers));
    theirs.push_back(run_mpsc_boost(per_producer / 4, producers));  // it is slow; fewer records
  }
  Row row{fmt::format("mpsc 64-byte records, {} producer(s)", producers), "M/s", median(ours),
          median(theirs)};
  print_row(row);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvrelay ring benchmarks: SPSC vs Boost.Lockfree, MPSC vs Boost message_queue"};
  uint64_t records = 5'000'000;
  int trials = 3;
  app.add_option("--records", records, "records per SPSC trial (MPSC: per producer, /2)");
  app.add_option("--trials", trials, "trials per case; the median is reported")
      ->check(CLI::Range(1, 100));
  kvrelay::add_version_flag(app, "kvrelay-bench-ring");
  KVRELAY_PARSE_COMMAND_LINE(app, argc, argv);

  print_header("SPSC ring throughput, cross-process (millions of records/s)", "boost spsc_queue");
  // 56 bytes is what kvrelay's own records are sized to: with the 8-byte
  // slot sequence, one record fills one cache line.
  const Row rows[] = {bench_spsc<16>(records, trials), bench_spsc<56>(records, trials),
                      bench_spsc<64>(records, trials)};
  double worst = rows[0].ratio();
  std::string ratios;
  for (const Row& r : rows) {
    worst = std::min(worst, r.ratio());
    ratios += fmt::format("{}{:.2f}x", ratios.empty() ? "" : ", ", r.ratio());
  }
  print_target("spsc >= 2x boost::lockfree::spsc_queue", worst >= 2.0, ratios);

  print_header("MPSC byte ring throughput (millions of records/s)", "boost message_queue");
  bench_mpsc(records / 2, 1, trials);
  bench_mpsc(records / 4, 2, trials);
  return 0;
}
