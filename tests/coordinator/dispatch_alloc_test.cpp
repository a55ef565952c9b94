// The dispatch path through the coordinator allocates nothing once warm
// (docs/latency.md): submissions read from the submit ring and decoded as
// the coordinator reads them (dispatch_submission, engine sessions), the
// task table (admission, its copies, the
// tasks it encodes once for every rank, the workers' reports, timers,
// tombstones), the task rings and the completion publisher, on a real
// control segment. Every operator new of the process is counted while the
// table takes steady-state requests (CacheTask + CacheDest over ipc to a
// peer with a long name, 36-character ids, tp 2; and swaps) from submission
// to completion. What the test itself does between the windows (building
// the submissions, draining the rings as the workers and the engine would)
// is not counted.
//
// Part of alloc_tests: it replaces the global operator new
// (support/allocation_counter.cpp).
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "coordinator/completion_publisher.h"
#include "coordinator/coordinator_counters.h"
#include "coordinator/engine_sessions.h"
#include "coordinator/ring_writer.h"
#include "coordinator/submission_reader.h"
#include "coordinator/task_table.h"
#include "schemas/codec.h"
#include "support/allocation_counter.h"
#include "support/test_segment.h"

namespace kvrelay::coordinator {
namespace {

using testing::AllocationWindow;

constexpr uint32_t kTp = 2;
constexpr uint32_t kBlocksPerRequest = 4;
constexpr const char* kPeer = "decode-instance-of-the-allocation-test";

// Delivers to real rings, as the coordinator does.
class RingSink : public Sink {
 public:
  RingSink(std::vector<RingWriter>& tasks, CompletionPublisher& publisher,
           CountersBlock& counters)
      : tasks_(tasks), publisher_(publisher), counters_(counters) {}
  void to_worker(uint32_t rank, capnp::MessageBuilder& task) override {
    tasks_[rank].write(schema::MessageType::WORKER_TASK, task);
  }
  void complete(capnp::MessageBuilder& completion) override { publisher_.publish(completion); }
  void observe_hop(CoordinatorHistogram hop, uint64_t ns) override {
    CounterWriter(counters_).record(hop, ns);
  }

 private:
  std::vector<RingWriter>& tasks_;
  CompletionPublisher& publisher_;
  CountersBlock& counters_;
};

class DispatchAllocations : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = testing::test_config(kTp);
    config_.host_blocks = 64;
    control_ = testing::create_test_segment(config_);
    ASSERT_TRUE(control_);
    CountersBlock& counters = control_->counters(kCoordinatorCounters);
    define_counters(
        counters,
        {std::begin(kCoordinatorCounterLabels), std::end(kCoordinatorCounterLabels)},
        {std::begin(kCoordinatorHistogramLabels), std::end(kCoordinatorHistogramLabels)});
    for (uint32_t r = 0; r < kTp; ++r) {
      task_readers_.push_back(control_->task_ring(r).value());
      task_writers_.emplace_back(control_->task_ring(r)->lease_producer().value(), nullptr);
    }
    submit_reader_ = std::make_unique<MpscRing>(control_->submit_ring().value());
    sessions_ = std::make_unique<EngineSessions>(control_->submit_ring().value());
    engine_ = std::make_unique<MpscProducer>(control_->submit_ring()->lease_producer().value());
    completion_reader_ = std::make_unique<MpscRing>(control_->completion_ring().value());
    completion_writer_ = std::make_unique<RingWriter>(
        control_->completion_ring()->lease_producer().value(), nullptr);
    publisher_ = std::make_unique<CompletionPublisher>(*completion_writer_, counters,
                                                       kRequestLatencyNs, [] {});
    sink_ = std::make_unique<RingSink>(task_writers_, *publisher_, counters);
    TableOptions options;
    options.own_instance = config_.instance;
    options.own_tp_size = kTp;
    const uint32_t peer_blocks = config_.num_blocks;
    options.peer_info = [peer_blocks](std::string_view) {
      return std::optional<PeerInfo>(PeerInfo{peer_blocks, kTp, Role::kDecode});
    };
    table_ = std::make_unique<TaskTable>(messages::Limits::from(config_), std::move(options),
                                         *sink_);
  }

  // The submissions of request `n`, as flat bytes (built outside any window).
  struct Submission {
    std::string id;
    kj::Array<capnp::word> first;   // CacheTask, or SwapTask
    kj::Array<capnp::word> second;  // CacheDest (cache requests)
  };
  Submission cache_request(uint64_t n) {
    Submission s;
    s.id = fmt::format("{:08x}-4e2b-9c1d-7f3a-{:012x}", n * 2654435761u, n);  // like a uuid
    std::vector<uint32_t> blocks;
    for (uint32_t b = 0; b < kBlocksPerRequest; ++b)
      blocks.push_back(static_cast<uint32_t>((n * kBlocksPerRequest + b) % config_.num_blocks));
    {
      capnp::MallocMessageBuilder m;
      auto t = m.initRoot<schema::CacheTask>();
      t.setRequestId(s.id);
      auto src = t.initSrcBlockIds(kBlocksPerRequest);
      for (uint32_t i = 0; i < kBlocksPerRequest; ++i)
        src.set(i, blocks[i]);
      t.setNeedPrefillTokens(kBlocksPerRequest * config_.block_size);
      t.setClientSubmitNs(mono_now_ns());
      s.first = capnp::messageToFlatArray(m);
    }
    {
      capnp::MallocMessageBuilder m;
      auto d = m.initRoot<schema::CacheDest>();
      d.setRequestId(s.id);
      auto dst = d.initDestBlockIds(kBlocksPerRequest);
      for (uint32_t i = 0; i < kBlocksPerRequest; ++i)
        dst.set(i, blocks[(i + 1) % kBlocksPerRequest]);
      d.setProtocol(schema::TransferProtocol::IPC);
      d.setPeerInstance(kPeer);
      auto devices = d.initDeviceIds(kTp);
      for (uint32_t i = 0; i < kTp; ++i)
        devices.set(i, i);
      s.second = capnp::messageToFlatArray(m);
    }
    return s;
  }
  Submission swap_request(uint64_t n) {
    Submission s;
    s.id = fmt::format("swap-{:08x}-4e2b-9c1d-{:012x}", n * 2654435761u, n);
    capnp::MallocMessageBuilder m;
    auto t = m.initRoot<schema::SwapTask>();
    t.setRequestId(s.id);
    t.setDirection(schema::SwapTask::Direction::EVICT);
    auto device = t.initDeviceBlockIds(kBlocksPerRequest);
    auto host = t.initHostBlockIds(kBlocksPerRequest);
    for (uint32_t i = 0; i < kBlocksPerRequest; ++i) {
      device.set(i, static_cast<uint32_t>((n * kBlocksPerRequest + i) % config_.num_blocks));
      host.set(i, static_cast<uint32_t>((n * kBlocksPerRequest + i) % config_.host_blocks));
    }
    s.first = capnp::messageToFlatArray(m);
    return s;
  }

  // The engine's write (not counted).
  void submit(schema::MessageType type, const kj::Array<capnp::word>& words) {
    const auto bytes = words.asBytes();
    Status s = engine_->try_write(
        static_cast<int32_t>(type),
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.begin()),
                                   bytes.size()));
    ASSERT_TRUE(s) << s.error().message;
  }
  // The coordinator's read: every submission waiting (counted).
  void read_submissions() {
    (void)submit_reader_->read([&](const MpscRecord& rec) {
      dispatch_submission(rec, *table_, *sessions_, stats_, mono_now_ns());
    });
  }

  // What the workers read: the handles of the tasks of `kind`.
  std::vector<uint64_t> drain_tasks(uint32_t rank, schema::WorkerTask::Which kind) {
    std::vector<uint64_t> handles;
    (void)task_readers_[rank].read([&](const MpscRecord& rec) {
      Status s = messages::with_message<schema::WorkerTask>(
          rec.payload, [&](schema::WorkerTask::Reader w) -> Status {
            if (w.which() == kind) handles.push_back(w.getHandle());
            ++tasks_seen_;
            return {};
          });
      EXPECT_TRUE(s) << s.error().message;
    });
    return handles;
  }
  // What the engine reads: (id, status) of every completion.
  std::vector<std::pair<std::string, schema::Completion::Status>> drain_completions() {
    std::vector<std::pair<std::string, schema::Completion::Status>> out;
    (void)completion_reader_->read([&](const MpscRecord& rec) {
      Status s = messages::with_message<schema::Completion>(
          rec.payload, [&](schema::Completion::Reader c) -> Status {
            out.emplace_back(c.getRequestId().cStr(), c.getStatus());
            if (c.getStatus() != schema::Completion::Status::FINISHED)
              ADD_FAILURE() << c.getRequestId().cStr() << ": " << c.getMessage().cStr();
            return {};
          });
      EXPECT_TRUE(s) << s.error().message;
    });
    return out;
  }
  records::WorkerReport finished(uint64_t handle, uint32_t rank) {
    records::WorkerReport r{};
    r.handle = handle;
    r.rank = rank;
    r.kind = static_cast<uint32_t>(records::ReportKind::kFinished);
    r.bytes_moved = 4096;
    r.reported_ns = mono_now_ns();
    return r;
  }

  // One request from submission to completion: its parts go into the
  // submit ring, every rank is sent one task of `kind` and reports it
  // finished, and its one completion names it. Returns the allocations
  // counted inside the coordinator's calls.
  uint64_t run(const Submission& s, schema::MessageType first, schema::WorkerTask::Which kind) {
    submit(first, s.first);
    if (s.second.size() != 0) submit(schema::MessageType::CACHE_DEST, s.second);
    uint64_t counted = 0;
    {
      AllocationWindow window;
      read_submissions();
      counted += window.stop();
    }
    std::vector<records::WorkerReport> reports;
    for (uint32_t r = 0; r < kTp; ++r) {
      const std::vector<uint64_t> handles = drain_tasks(r, kind);
      EXPECT_EQ(handles.size(), 1u) << "rank " << r << " was sent " << s.id << "'s task";
      if (handles.size() != 1) return counted;
      reports.push_back(finished(handles[0], r));
    }
    {
      AllocationWindow window;
      const uint64_t now = mono_now_ns();
      for (const records::WorkerReport& rep : reports)
        table_->on_report(rep, now);
      (void)table_->tick(now);
      counted += window.stop();
    }
    const auto done = drain_completions();
    EXPECT_EQ(done.size(), 1u);
    if (!done.empty()) {
      EXPECT_EQ(done[0].first, s.id);
    }
    return counted;
  }
  uint64_t run_cache_request(uint64_t n) {
    return run(cache_request(n), schema::MessageType::CACHE_TASK, schema::WorkerTask::DEST);
  }
  uint64_t run_swap(uint64_t n) {
    return run(swap_request(n), schema::MessageType::SWAP_TASK, schema::WorkerTask::SWAP);
  }

  InstanceConfig config_{};
  testing::TestSegment control_;
  std::vector<MpscRing> task_readers_;
  std::vector<RingWriter> task_writers_;
  std::unique_ptr<MpscRing> submit_reader_;
  std::unique_ptr<EngineSessions> sessions_;
  std::unique_ptr<MpscProducer> engine_;
  SubmissionStats stats_;
  std::unique_ptr<MpscRing> completion_reader_;
  std::unique_ptr<RingWriter> completion_writer_;
  std::unique_ptr<CompletionPublisher> publisher_;
  std::unique_ptr<RingSink> sink_;
  std::unique_ptr<TaskTable> table_;
  uint64_t tasks_seen_ = 0;
};

TEST_F(DispatchAllocations, CacheRequestsAllocateNothingFromSubmissionToCompletionOnceWarm) {
  for (uint64_t n = 0; n < 32; ++n)  // warm-up: the first nodes, buffers, bucket arrays
    (void)run_cache_request(n);
  const uint64_t before = table_->counters().finished;
  uint64_t allocations = 0;
  for (uint64_t n = 32; n < 232; ++n)
    allocations += run_cache_request(n);
  EXPECT_EQ(table_->counters().finished - before, 200u) << "every request finished";
  EXPECT_EQ(stats_.malformed, 0u);
  EXPECT_EQ(table_->live(), 0u);
  EXPECT_EQ(allocations, 0u) << "allocations while the table took 200 cache requests (tp "
                             << kTp << ") from submission to completion";
}

TEST_F(DispatchAllocations, SwapsAllocateNothingFromSubmissionToCompletionOnceWarm) {
  for (uint64_t n = 0; n < 32; ++n)
    (void)run_swap(n);
  const uint64_t before = table_->counters().finished;
  uint64_t allocations = 0;
  for (uint64_t n = 32; n < 232; ++n)
    allocations += run_swap(n);
  EXPECT_EQ(table_->counters().finished - before, 200u);
  EXPECT_EQ(allocations, 0u) << "allocations while the table took 200 swaps";
}

TEST_F(DispatchAllocations, TheFirstRequestsDoAllocate) {
  // The windows see the table's allocations: a cold table allocates its
  // first nodes and buffers.
  EXPECT_GT(run_cache_request(0), 0u);
}

}  // namespace
}  // namespace kvrelay::coordinator
