// Liveness slots and the pidfd watcher: how kvrelay processes notice that a
// peer died, within a second and without hanging.
//
// Every process owns a slot in the control segment holding its identity
// (pid, start time, pid namespace) and a heartbeat, and holds the owner lock
// on the slot's first byte (owner_lock.h) for as long as it lives. Peers
// judge each other by that lock: free means dead, proven, whatever was written
// into the slot and whichever pid namespace the owner runs in; held means
// alive, and then the heartbeat's age tells a serving peer from a stopped or
// stuck one. Where no lock can be probed (memory that is not a file, in
// tests) the identity is checked against /proc instead. A supervisor that
// started a process also watches it with a pidfd, which becomes readable the
// moment the child exits.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "shm/clock.h"
#include "shm/owner_lock.h"
#include "shm/process_identity.h"
#include "shm/result.h"

namespace kvrelay {

enum class SlotState : uint32_t {
  kEmpty = 0,     // never registered, or released on clean exit
  kStarting = 1,  // registered, not ready yet
  kReady = 2,     // serving
  kExiting = 3,   // shutting down cleanly
};
const char* slot_state_name(uint32_t state);

// One per process. Written only by its owner (register, heartbeat, state),
// except that a supervisor may reset the slot of a process it saw die.
// Fields are published under a sequence counter (odd while being rewritten)
// so a reader never mixes two owners' pid and start time.
struct alignas(64) LivenessSlot {
  std::atomic<uint32_t> sequence;  // odd while the identity is rewritten
  std::atomic<uint32_t> state;     // SlotState
  std::atomic<uint32_t> pid;
  std::atomic<uint32_t> registrations;  // how many processes have owned this slot
  std::atomic<uint64_t> start_time;     // clock ticks after boot
  std::atomic<uint64_t> heartbeat_ns;   // CLOCK_MONOTONIC of the last heartbeat
  std::atomic<uint64_t> registered_ns;
  std::atomic<uint64_t> pid_ns;  // the owner's pid namespace (inode)
  uint8_t reserved[16];
};
static_assert(sizeof(LivenessSlot) == 64);

struct SlotSnapshot {
  SlotState state = SlotState::kEmpty;
  ProcessIdentity owner;
  uint32_t registrations = 0;
  uint64_t heartbeat_ns = 0;
  uint64_t registered_ns = 0;
};

// Owner side.
void register_self(LivenessSlot& slot, SlotState state = SlotState::kStarting);
inline void heartbeat(LivenessSlot& slot) {
  slot.heartbeat_ns.store(mono_now_ns(), std::memory_order_release);
}
inline void set_state(LivenessSlot& slot, SlotState state) {
  slot.state.store(static_cast<uint32_t>(state), std::memory_order_release);
}
// Clean exit: marks the slot empty so that nobody mistakes it for a crash.
void release_slot(LivenessSlot& slot);

// Observer side.
SlotSnapshot read_slot(const LivenessSlot& slot);

enum class PeerHealth {
  kAbsent,   // slot empty
  kHealthy,  // heartbeat fresh
  kSilent,   // heartbeat older than the limit, but the process still exists (stopped, stuck)
  kDead,     // its process is gone (or the pid now belongs to someone else)
};
const char* peer_health_name(PeerHealth h);

// Judges a peer from its slot and its owner lock: a free lock beats
// everything (dead); then the heartbeat's age. `lock` kUnknown falls back to
// checking the recorded identity against /proc.
PeerHealth judge_peer(const SlotSnapshot& slot, Nanos max_heartbeat_age,
                      LockState lock = LockState::kUnknown);

// judge_peer() for hot paths (a check per submit, per signal push): the
// owner-lock probe (a system call, ~0.5 us, but ~10 us on some VMs) is
// repeated at most every `recheck`; in between, a peer found alive is taken
// to be alive still. The heartbeat and the slot's state are read on every
// call. A peer that died is therefore noticed within `recheck`. Lock-free and
// allocation-free, so a CUDA host callback may call it; thread-safe.
class CachedPeerJudge {
 public:
  CachedPeerJudge(LockSpace owner_lock, Nanos recheck = std::chrono::milliseconds(10))
      : lock_(owner_lock), recheck_(recheck) {}
  PeerHealth judge(const SlotSnapshot& slot, Nanos max_heartbeat_age);
  // The lock alone (for peers whose slot may not be registered yet).
  LockState lock_state();

 private:
  LockSpace lock_;
  Nanos recheck_;
  std::atomic<uint64_t> checked_ns_{0};
  std::atomic<int> last_{static_cast<int>(LockState::kUnknown)};
};

// Watches child processes through pidfds. Not thread-safe; one owner.
//
// Where pidfd_open is refused (a container's seccomp profile that predates
// it, a kernel before 5.3), a child is watched by polling instead: wait()
// then looks at it with waitid() at most every kPollEvery, however often it
// is called (and at least that often while it waits). Nothing else changes.
class PidfdWatcher {
 public:
  struct Exit {
    uint32_t pid = 0;
    int exit_code = -1;            // when exited normally
    int signal = 0;                // when killed by a signal
    std::string describe() const;  // "exit code 3" / "killed by SIGKILL"
  };
  static constexpr Nanos kPollEvery = std::chrono::milliseconds(5);

  PidfdWatcher() = default;
  PidfdWatcher(const PidfdWatcher&) = delete;
  PidfdWatcher& operator=(const PidfdWatcher&) = delete;
  ~PidfdWatcher();

  // Starts watching `pid` (a child of this process, not yet reaped).
  Status watch(uint32_t pid);
  // Waits until at least one watched child exits or `deadline` passes, then
  // reaps every exited child and returns them (possibly none).
  std::vector<Exit> wait(Deadline deadline);
  size_t watched() const { return entries_.size(); }
  // Why children are polled rather than watched through pidfds (the first
  // refused pidfd_open); empty while every child has a pidfd.
  const std::string& polling_reason() const { return polling_reason_; }

 private:
  struct Entry {
    uint32_t pid;
    int fd;  // -1: polled
  };
  // Reaps `e` if it has exited (a readable pidfd, or a polled child).
  std::optional<Exit> reap(const Entry& e) const;
  std::vector<Entry> entries_;
  std::string polling_reason_;
  uint64_t next_look_ns_ = 0;  // when the polled children are due again
};

}  // namespace kvrelay
