// Who a process is, in a way that survives pid reuse: (pid, start time, pid
// namespace, boot). kvrelay decides whether a peer lives by its owner lock
// (owner_lock.h); the identity is for people, and a fallback where no lock
// can be probed.
//
// A pid alone is not an identity: after a process dies its pid can be handed
// to a new, unrelated process. The start time (clock ticks after boot, field
// 22 of /proc/<pid>/stat) tells the two apart, and the boot id tells a
// segment left over from a previous boot (tmpfs is normally wiped, but
// containers may keep /dev/shm) from one of this boot. Containers that share
// /dev/shm but not a pid namespace cannot judge each other's pids at all; the
// namespace says when that is the case.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace kvrelay {

struct ProcessIdentity {
  uint32_t pid = 0;
  uint64_t start_time = 0;  // clock ticks after boot; 0 when unknown
  uint64_t pid_ns = 0;      // inode of the process's pid namespace; 0 when unknown
};

// This process.
ProcessIdentity self_identity();
// getpid(), cached (glibc makes getpid a real system call; this is a load).
// Refreshed in a forked child.
uint32_t self_pid();
// The process currently holding `pid`, or {pid, 0} when there is none.
ProcessIdentity identity_of(uint32_t pid);

// Whether a running process (not a zombie) currently holds `pid`.
bool pid_exists(uint32_t pid);

enum class Liveness {
  kAlive,         // the same process is still running
  kGone,          // nothing holds that pid any more
  kPidReused,     // the pid is held by a different process (other start time)
  kOtherBoot,     // recorded in a previous boot of this machine
  kUnverifiable,  // recorded in another pid namespace: its pid means nothing here
};

// Whether the process recorded as `recorded` (in boot `boot_id`) still runs.
Liveness check_liveness(const ProcessIdentity& recorded, const std::string& boot_id);
const char* liveness_name(Liveness l);

// The inode of this process's pid namespace (/proc/self/ns/pid), read once.
uint64_t self_pid_ns();

// /proc/sys/kernel/random/boot_id, read once.
const std::string& boot_id();

}  // namespace kvrelay
