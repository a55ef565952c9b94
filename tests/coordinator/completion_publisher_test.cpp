// The completion publisher on a real control segment: a completion reaches
// the ring stamped no earlier than its publication, a finished one records
// its latency, a message too long for one record is cut instead of lost, and
// the hook runs before each write.
#include "coordinator/completion_publisher.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "coordinator/coordinator_counters.h"
#include "instance/control_segment.h"
#include "schemas/codec.h"
#include "shm/clock.h"
#include "support/test_segment.h"

namespace kvrelay::coordinator {
namespace {

struct Published {
  std::string id;
  std::string message;
  uint64_t completed_ns = 0;
};

class CompletionPublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    InstanceConfig config = testing::test_config(1);
    config.completion_ring_bytes = kMinCompletionRingBytes;
    control_ = testing::create_test_segment(config);
    ASSERT_TRUE(control_);
    reader_ = std::make_unique<MpscRing>(control_->completion_ring().value());
    ring_ = std::make_unique<RingWriter>(control_->completion_ring()->lease_producer().value(),
                                         nullptr);
    CountersBlock& counters = control_->counters(kCoordinatorCounters);
    define_counters(counters, {"unused"}, {{"request_latency", "ns"}});
    publisher_ = std::make_unique<CompletionPublisher>(*ring_, counters, 0, [this] { ++hooks_; });
  }
  void publish(const std::string& id, schema::Completion::Status status, uint64_t submitted_ns,
               uint64_t completed_ns, const std::string& message = "") {
    capnp::MallocMessageBuilder msg;
    auto c = msg.initRoot<schema::Completion>();
    c.setRequestId(id);
    c.setStatus(status);
    c.setSubmittedNs(submitted_ns);
    c.setCompletedNs(completed_ns);
    c.setMessage(message);
    publisher_->publish(msg);
  }

  std::vector<Published> read_all() {
    std::vector<Published> out;
    (void)reader_->read([&](const MpscRecord& rec) {
      EXPECT_EQ(rec.type, static_cast<int32_t>(schema::MessageType::COMPLETION));
      Status s = messages::with_message<schema::Completion>(
          rec.payload, [&](schema::Completion::Reader c) -> Status {
            out.push_back({c.getRequestId().cStr(), c.getMessage().cStr(), c.getCompletedNs()});
            return {};
          });
      EXPECT_TRUE(s) << s.error().message;
    });
    return out;
  }

  uint64_t latency_samples() {
    const CountersSnapshot s = snapshot_counters(control_->counters(kCoordinatorCounters));
    return s.histograms.empty() ? 0 : s.histograms[0].count;
  }

  testing::TestSegment control_;
  std::unique_ptr<MpscRing> reader_;
  std::unique_ptr<RingWriter> ring_;
  std::unique_ptr<CompletionPublisher> publisher_;
  int hooks_ = 0;
};

TEST_F(CompletionPublisherTest, StampsThePublicationTimeAndRunsTheHookFirst) {
  const uint64_t before = mono_now_ns();
  publish("a", schema::Completion::Status::ERROR, before - 5, 1);  // an old loop clock
  EXPECT_EQ(hooks_, 1);
  const std::vector<Published> got = read_all();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].id, "a");
  // An order on the monotonic clock, not a duration: the stamp is the
  // publication's own (taken after `before`), not the caller's 1.
  EXPECT_GE(got[0].completed_ns, before);
  EXPECT_EQ(latency_samples(), 0u) << "only finished requests have a latency";
}

TEST_F(CompletionPublisherTest, AFinishedRequestRecordsItsLatency) {
  const uint64_t now = mono_now_ns();
  publish("a", schema::Completion::Status::FINISHED, now - 1000, 0);
  publish("b", schema::Completion::Status::FINISHED, 0, 0);  // never submitted: no latency
  EXPECT_EQ(read_all().size(), 2u);
  EXPECT_EQ(latency_samples(), 1u);
}

TEST_F(CompletionPublisherTest, AMessageTooLongForOneRecordIsCutNotLost) {
  const std::string huge(ring_->max_payload_bytes() * 2, 'x');
  publish("long", schema::Completion::Status::ERROR, 0, 0, huge);
  publish("next", schema::Completion::Status::ERROR, 0, 0, "fine");
  const std::vector<Published> got = read_all();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].id, "long");
  EXPECT_LT(got[0].message.size(), 300u);
  EXPECT_NE(got[0].message.find("[cut: too long for the completion ring]"), std::string::npos);
  EXPECT_EQ(got[1].message, "fine");
}

}  // namespace
}  // namespace kvrelay::coordinator
