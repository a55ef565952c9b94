#include "coordinator/completion_publisher.h"

#include <algorithm>
#include <string>

#include "coordinator/coordinator_counters.h"
#include "schemas/codec.h"
#include "shm/clock.h"

namespace kvrelay::coordinator {

void CompletionPublisher::publish(capnp::MessageBuilder& completion) {
  auto stamp = completion.getRoot<schema::Completion>();
  // The table stamps when it decided (for a finished request: when it read
  // the last report); the completion carries when it is written.
  const uint64_t decided_ns = stamp.getCompletedNs();
  stamp.setCompletedNs(std::max(decided_ns, mono_now_ns()));
  auto c = stamp.asReader();
  if (c.getStatus() == schema::Completion::Status::FINISHED && c.getSubmittedNs() != 0) {
    CounterWriter w(counters_);
    w.record(latency_histogram_, c.getCompletedNs() - c.getSubmittedNs());
    if (decided_ns != 0) w.record(kReportReadToCompletionNs, c.getCompletedNs() - decided_ns);
  }
  if (before_publish_) before_publish_();
  // The table caps its texts; this is the last guard that a completion
  // always fits one record. The cut message goes into a fresh builder: the
  // long text stays allocated in the old one's arena (setting a field never
  // frees what it replaces), so rewriting it in place would not shrink it.
  if (messages::encoded_bytes(completion) > ring_.max_payload_bytes()) {
    const std::string message = c.getMessage().cStr();
    stamp.setMessage(message.substr(0, 200) + "... [cut: too long for the completion ring]");
    capnp::MallocMessageBuilder compact;
    compact.setRoot(stamp.asReader());
    ring_.write(schema::MessageType::COMPLETION, compact);
    return;
  }
  ring_.write(schema::MessageType::COMPLETION, completion);
}

}  // namespace kvrelay::coordinator
