// Whether each rank's worker is up, in either mode:
//  - supervised (the default): the coordinator starts the workers, notices an
//    exit at once through its pidfd, restarts it with backoff, and gives up a
//    worker that cannot start (Supervisor);
//  - external workers (--external-workers): another supervisor starts them;
//    a rank is lost when its owner lock (held by its worker for its life) is
//    free, and back when a new worker registers.
// It keeps the ready flags (the original's cache_ready_signal) in step, and
// tells its Listener when a rank is lost and when it is back, so that the
// coordinator can fail and clean up what the rank held.
//
// Not thread-safe: the coordinator's loop owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/options.h"
#include "coordinator/supervisor.h"
#include "instance/control_segment.h"
#include "shm/clock.h"

namespace kvrelay::coordinator {

class RankHealth {
 public:
  class Listener {
   public:
    virtual ~Listener() = default;
    // The rank's worker died (confirmed). `reason` says how.
    virtual void rank_lost(uint32_t rank, const std::string& reason, uint64_t now_ns) = 0;
    // A new worker was started for it (supervised) or registered (external).
    virtual void rank_up(uint32_t rank) = 0;
  };

  RankHealth(const ControlSegment& control, const CoordinatorOptions& options, Listener& listener);

  // Supervised: starts every rank's worker.
  Status start();
  // Waits until every rank's worker is ready. False when one gave up, `stop`
  // says so, or `until` passes (each logged with the rank and why).
  bool wait_ready(Deadline until, const std::function<bool()>& stop,
                  const std::function<void()>& tick);
  // Exits, restarts, external liveness and ready flags; cheap enough for
  // every loop turn (the pidfd poll runs at most every millisecond).
  void supervise(uint64_t now_ns);
  // A rank that must stop writing now (it did not confirm a withdrawal):
  // supervised, its worker is killed and its exit will be reported; false
  // when it cannot be (an external worker).
  bool stop_rank(uint32_t rank, const std::string& why);
  bool gave_up(uint32_t rank) const;
  // Whether the rank's worker is up (not lost and not waiting for a restart).
  bool up(uint32_t rank) const { return !lost_[rank]; }
  // When supervise() has something to do next (a restart).
  uint64_t next_due_ns() const;
  void stop_all(Deadline deadline);

 private:
  void lost(uint32_t rank, const std::string& reason, uint64_t now_ns);
  void update_ready_flags();

  const ControlSegment& control_;
  const CoordinatorOptions& options_;
  Listener& listener_;
  uint32_t tp_;
  std::unique_ptr<Supervisor> supervisor_;  // null with external workers
  std::vector<uint32_t> seen_registrations_;
  std::vector<bool> lost_;
  uint64_t next_exit_poll_ = 0;
  uint64_t next_external_check_ = 0;
};

}  // namespace kvrelay::coordinator
