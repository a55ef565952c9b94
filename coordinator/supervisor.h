// Starts one kvrelay-worker per rank and restarts a crashed one with
// exponential backoff, logging why it died (exit code or signal, and the
// reason the worker left in the instance status). Children are watched
// through pidfds, so an exit is noticed at the next poll, not at a heartbeat
// timeout, and they die with the coordinator (PR_SET_PDEATHSIG).
//
// A worker that cannot start for a reason a restart will not cure (exit code
// kWorkerExitRefused: another user's segment, a rank already served by
// another process), or that fails the same way at every start before it is
// ready, is given up: it stays down, and the instance says why. A worker
// that became ready and then died (an OOM kill, a crash while serving) is
// restarted however often that happens, with the backoff growing to 5 s:
// whatever killed it may pass, and a rank given up takes the whole instance
// out of service until someone restarts it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "shm/clock.h"
#include "shm/liveness.h"
#include "shm/result.h"

namespace kvrelay::coordinator {

// kvrelay-worker's exit codes.
inline constexpr int kWorkerExitError = 1;     // failed while serving: restart it
inline constexpr int kWorkerExitRefused = 3;   // cannot start here, and will not by retrying
inline constexpr int kWorkerExitUnusable = 4;  // its rings are unusable: reset them, restart it

struct WorkerExit {
  uint32_t rank;
  uint32_t pid;
  std::string reason;    // "exit code 3" / "killed by SIGKILL"
  int exit_code = -1;    // when it exited
  bool gave_up = false;  // it will not be restarted
};

class Supervisor {
 public:
  // `worker_args` are appended to every worker's command line.
  Supervisor(std::string worker_binary, std::string instance, uint32_t tp_size, std::string log_dir,
             std::string log_level, std::vector<std::string> worker_args = {});
  // Consecutive identical failures, each before the worker was ready, after
  // which it is given up.
  static constexpr uint32_t kGiveUpAfter = 5;
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  Status start_all();
  // Workers that exited since the last call (reaped). Waits at most until
  // `deadline` for the first one.
  std::vector<WorkerExit> poll_exits(Deadline deadline);
  // Starts the ranks whose restart backoff has passed. Returns ranks started.
  std::vector<uint32_t> restart_due(uint64_t now_ns);
  // The rank's current worker (`pid`) said it is ready: its start did not
  // fail, whatever ends it later. A stale pid (an earlier worker) is ignored.
  void note_ready(uint32_t rank, uint32_t pid);
  // The next time restart_due() has something to do (UINT64_MAX: nothing).
  uint64_t next_restart_ns() const;
  // Stops restarting; waits for the workers to exit until `deadline`, then
  // SIGKILLs the rest.
  void stop_all(Deadline deadline);
  uint32_t pid_of(uint32_t rank) const { return ranks_[rank].pid; }
  uint32_t restarts(uint32_t rank) const { return ranks_[rank].restarts; }
  bool gave_up(uint32_t rank) const { return ranks_[rank].gave_up; }

 private:
  struct Rank {
    uint32_t pid = 0;
    uint64_t started_ns = 0;
    uint64_t restart_at_ns = 0;  // 0: not waiting for a restart
    uint32_t restarts = 0;
    uint32_t consecutive_failures = 0;  // each within a short run: the backoff grows
    uint32_t failed_starts = 0;         // in a row, each ended before its worker was ready
    bool ready = false;                 // the current worker said it is ready
    std::string last_failure;  // how it last ended, to see a worker fail the same way
    bool gave_up = false;
  };
  Status spawn(uint32_t rank);

  std::string worker_binary_;
  std::string instance_;
  std::string log_dir_;
  std::string log_level_;
  std::vector<std::string> worker_args_;
  std::vector<Rank> ranks_;
  PidfdWatcher watcher_;
  bool told_polling_ = false;  // the watcher's fallback is logged once
  bool stopping_ = false;
};

// kvrelay-worker next to the running executable.
std::string default_worker_binary();

}  // namespace kvrelay::coordinator
