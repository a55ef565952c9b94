// Proof of life that needs no pid: an owner holds an open-file-description
// lock (F_OFD_SETLK) on one byte of a shared file for as long as it lives.
//
// The kernel drops the lock when the last descriptor of that open file
// description closes, which happens when the owner exits, however it exits
// (SIGKILL included). So "the byte is locked" proves the owner still runs,
// and "the byte is free" proves it is gone, without reading /proc, without
// trusting a pid written into shared memory (a same-uid process can scribble
// on that), and across pid namespaces (containers that share /dev/shm but
// not a pid namespace see each other's locks, not each other's pids).
// iceoryx2 detects dead nodes the same way.
//
// Each owner locks the byte at the file offset of the structure it owns (its
// liveness slot, its ring producer slot, the segment preamble for the
// coordinator), so the offsets need no table of their own.
//
// Caveats, both on the side of "alive": a child forked without exec shares
// its parent's open file descriptions, so it keeps the parent's locks; and a
// process probing a byte it locked itself through the same description sees
// it free. kvrelay's segments are opened O_CLOEXEC and each attach opens its
// own description.
#pragma once

#include <cstdint>

namespace kvrelay {

enum class LockState { kHeld, kFree, kUnknown };
const char* lock_state_name(LockState s);

// Where a structure's owner locks live: the file that holds it (a segment's
// descriptor) and the file offset of the structure. fd -1 means no file
// (anonymous memory in tests and benchmarks): every lock is granted and every
// probe answers kUnknown, which callers treat as "maybe alive".
struct LockSpace {
  int fd = -1;
  uint64_t base = 0;

  LockSpace at(uint64_t offset) const { return {fd, base + offset}; }
  // Takes an exclusive lock on byte base + offset. False when another open
  // file description holds it (or the file does not allow it).
  [[nodiscard]] bool try_lock(uint64_t offset = 0) const;
  void unlock(uint64_t offset = 0) const;
  // Whether another open file description holds byte base + offset. One
  // fcntl: about half a microsecond.
  [[nodiscard]] LockState probe(uint64_t offset = 0) const;
};

}  // namespace kvrelay
