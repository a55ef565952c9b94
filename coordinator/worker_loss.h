// What a lost worker leaves behind that its successor must not see: the
// records still in its task ring (its requests have failed: the task table
// answered them), the layer signals pushed for those requests, and a
// barrier round its peers may be waiting in. The coordinator clears them
// once the loss is confirmed (RankHealth::Listener::rank_lost), after the
// task table has failed the rank's requests.
#pragma once

#include <cstddef>
#include <cstdint>

#include "coordinator/ring_writer.h"
#include "instance/control_segment.h"

namespace kvrelay::coordinator {

struct LeftBehind {
  size_t queued_tasks = 0;  // in the writer's backlog, never written
  uint64_t ring_bytes = 0;  // written to the task ring, never read
  size_t signals = 0;
  bool anything() const { return queued_tasks != 0 || ring_bytes != 0 || signals != 0; }
};

// Resets rank `rank`'s task ring outright (the coordinator is its only
// producer and its consumer is dead), drops its signals, and poisons the
// barrier so that nobody lined up with it waits for it.
LeftBehind clear_lost_rank(const ControlSegment& control, uint32_t rank, RingWriter& task_ring);

}  // namespace kvrelay::coordinator
