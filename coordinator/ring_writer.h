// Writes Cap'n Proto messages into an MPSC ring without ever dropping one:
// when the ring is full, messages wait in a local backlog, in order, and
// flush() retries. The coordinator's completions and per-rank tasks go
// through one each; the reader on the other side (engine, worker) drains the
// ring and the backlog empties.
#pragma once

#include <capnp/message.h>
#include <kj/array.h>

#include <cstdint>
#include <deque>

#include "schemas/kvrelay.capnp.h"
#include "shm/mpsc_ring.h"
#include "shm/wait_event.h"

namespace kvrelay::coordinator {

class RingWriter {
 public:
  // `doorbell`, if given, is rung after each flush that wrote something.
  RingWriter(MpscRing ring, WaitEvent* doorbell) : ring_(ring), doorbell_(doorbell) {}
  RingWriter(RingWriter&&) = default;
  RingWriter& operator=(RingWriter&&) = default;
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  void write(schema::MessageType type, capnp::MessageBuilder& message);
  // Writes what the ring has room for now. Returns true when the backlog is empty.
  bool flush();
  size_t backlog() const { return backlog_.size(); }
  // Forgets what has not reached the ring (its reader is gone). Returns how many.
  size_t discard_backlog() {
    const size_t n = backlog_.size();
    backlog_.clear();
    return n;
  }
  uint64_t delayed() const { return delayed_; }

 private:
  MpscRing ring_;
  WaitEvent* doorbell_;
  std::deque<std::pair<int32_t, kj::Array<capnp::word>>> backlog_;
  uint64_t delayed_ = 0;
};

}  // namespace kvrelay::coordinator
