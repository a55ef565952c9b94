#include "coordinator/hello_gate.h"

#include <algorithm>

namespace kvrelay::coordinator {

bool HelloGate::open(const std::vector<RingWriter>& tasks,
                     const std::function<bool(uint32_t)>& rank_up) {
  // What waits in a backlog has no ring position yet.
  if (std::any_of(tasks.begin(), tasks.end(), [](const RingWriter& w) { return w.backlog() != 0; }))
    return false;
  if (targets_.size() != tasks.size()) {
    targets_.clear();
    for (const RingWriter& w : tasks)
      targets_.push_back(w.written_up_to());
  }
  for (uint32_t r = 0; r < tasks.size(); ++r)
    if (rank_up(r) && !tasks[r].consumed_up_to(targets_[r])) return false;
  targets_.clear();
  return true;
}

}  // namespace kvrelay::coordinator
