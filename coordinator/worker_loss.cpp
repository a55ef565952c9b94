#include "coordinator/worker_loss.h"

#include "schemas/records.h"
#include "shm/barrier.h"

namespace kvrelay::coordinator {

LeftBehind clear_lost_rank(const ControlSegment& control, uint32_t rank, RingWriter& task_ring) {
  LeftBehind left;
  std::tie(left.queued_tasks, left.ring_bytes) = task_ring.reset();
  if (auto ring = control.signal_ring<records::LayerSignal>(rank)) {
    records::LayerSignal s{};
    while (ring->try_pop(s))
      ++left.signals;
  }
  Barrier(control.barrier()).poison(static_cast<uint16_t>(control.config().tp_size));
  return left;
}

}  // namespace kvrelay::coordinator
