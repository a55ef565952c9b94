// Turns the records read from the submit ring into task-table calls: decodes
// each in place (Cap'n Proto, with limits), names its engine session (from
// the ring record's producer slot and generation), and answers what cannot
// be decoded with a rejected completion. Session hellos go to the sessions.
#pragma once

#include <cstdint>

#include "coordinator/engine_sessions.h"
#include "coordinator/task_table.h"
#include "shm/counters.h"
#include "shm/mpsc_ring.h"

namespace kvrelay::coordinator {

struct SubmissionStats {
  uint64_t malformed = 0;  // records that could not be decoded (answered as rejected)
  uint64_t hellos = 0;
};

void dispatch_submission(const MpscRecord& record, TaskTable& table, EngineSessions& sessions,
                         SubmissionStats& stats, uint64_t now_ns);

}  // namespace kvrelay::coordinator
