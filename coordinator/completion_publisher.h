// The last step of every request: its one completion, published on the
// completion ring. Stamps the time it is published (the loop's clock may be
// older than the reports that completed it), records the latency of what
// finished, and cuts a message that would not fit one ring record, so that
// nothing the table produces can fail to reach the engine.
#pragma once

#include <capnp/message.h>

#include <functional>

#include "coordinator/ring_writer.h"
#include "shm/counters.h"

namespace kvrelay::coordinator {

class CompletionPublisher {
 public:
  // `before_publish` runs just before each completion is written (the
  // coordinator mirrors its counters there: an engine that reads the
  // completion and then runs kvrelay-dump must find it counted).
  CompletionPublisher(RingWriter& ring, CountersBlock& counters, uint32_t latency_histogram,
                      std::function<void()> before_publish)
      : ring_(ring),
        counters_(counters),
        latency_histogram_(latency_histogram),
        before_publish_(std::move(before_publish)) {}

  // `completion`'s root is a schema::Completion; it is stamped in place.
  void publish(capnp::MessageBuilder& completion);

 private:
  RingWriter& ring_;
  CountersBlock& counters_;
  uint32_t latency_histogram_;
  std::function<void()> before_publish_;
};

}  // namespace kvrelay::coordinator
