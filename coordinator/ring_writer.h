// Writes Cap'n Proto messages into an MPSC ring without ever dropping one:
// when the ring is full, messages wait in a local backlog, in order, and
// flush() retries. The coordinator's completions and per-rank tasks go
// through one each; the reader on the other side (engine, worker) drains the
// ring and the backlog empties. The coordinator stops reading submissions
// while a backlog is long (kMaxBacklog), so that a slow reader makes the
// engine's submissions see `full` instead of growing the coordinator.
//
// The writer is the ring's only producer: it keeps its own copy of the tail
// and restores the shared one if another process overwrote it.
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
  static constexpr size_t kMaxBacklog = 1024;

  // `doorbell`, if given, is rung after each flush that wrote something.
  RingWriter(MpscProducer producer, WaitEvent* doorbell)
      : producer_(std::move(producer)), doorbell_(doorbell) {
    producer_.set_sole_producer();
  }
  RingWriter(RingWriter&&) = default;
  RingWriter& operator=(RingWriter&&) = default;
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  void write(schema::MessageType type, capnp::MessageBuilder& message);
  // Writes what the ring has room for now. Returns true when the backlog is empty.
  bool flush();
  size_t backlog() const { return backlog_.size(); }
  // Its reader died: drops what has not reached the ring and everything in
  // it, so that the next reader starts from nothing. Returns the records
  // dropped from the backlog and the bytes dropped from the ring.
  std::pair<size_t, uint64_t> reset() {
    const size_t n = backlog_.size();
    backlog_.clear();
    return {n, producer_.reset_ring()};
  }
  uint64_t delayed() const { return delayed_; }
  bool congested() const { return backlog_.size() >= kMaxBacklog; }
  uint32_t max_payload_bytes() const { return producer_.max_payload_bytes(); }
  // Whether the reader has consumed everything written so far (the backlog
  // aside): its head has reached our tail.
  bool consumed_all() const {
    const MpscRingHeader& h = producer_.ring().header();
    return h.head.load(std::memory_order_acquire) >= h.tail.load(std::memory_order_acquire);
  }
  uint64_t written_up_to() const {
    return producer_.ring().header().tail.load(std::memory_order_acquire);
  }
  bool consumed_up_to(uint64_t position) const {
    return producer_.ring().header().head.load(std::memory_order_acquire) >= position;
  }
  MpscProducer& producer() { return producer_; }

 private:
  MpscProducer producer_;
  WaitEvent* doorbell_;
  std::deque<std::pair<int32_t, kj::Array<capnp::word>>> backlog_;
  uint64_t delayed_ = 0;
};

}  // namespace kvrelay::coordinator
