// One WorkerTask from the coordinator, carried out on the rank's data plane:
// bind a request's prefill half, dispatch its destination, cancel, expect an
// arrival, check a connection, swap, register a pool, forget a dead session,
// shut down. What must be answered at once (a refused expect, a connect's
// result, a pool registration, a swap without a host tier) is reported
// through the outbox; everything else reports when the data plane finishes.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "schemas/kvrelay.capnp.h"
#include "worker/data_plane.h"
#include "worker/report_outbox.h"

namespace kvrelay::worker {

// What a task asks of the worker's loop beyond the data plane.
struct TaskEffect {
  bool shutdown = false;                  // the instance is shutting down: exit
  std::optional<std::string> broken;      // the data plane is gone: exit with this reason
  std::optional<uint32_t> session_ended;  // an engine session died (its GPU signals too)
};

// `apply_signals` drains the rank's signal ring (returns whether it applied
// any): a Bind must see every signal the engine pushed before it. `read_ns`:
// when the task was read off the ring (times the dispatch hop; 0: untimed).
TaskEffect dispatch_task(schema::WorkerTask::Reader task, uint32_t rank, DataPlane& data,
                         ReportOutbox& reports, const std::function<bool()>& apply_signals,
                         uint64_t read_ns = 0);

}  // namespace kvrelay::worker
