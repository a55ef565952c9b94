// What happens when another process truncates a segment this process has
// mapped: the next access past the new end raises SIGBUS, which would kill
// the process (a coordinator, a worker in the middle of a copy, a tool).
//
// Mapped segments register here. A SIGBUS inside a registered mapping
// replaces the whole mapping with private zero pages (so the faulting access,
// and every later one, completes) and marks the mapping truncated; the code
// that uses the segment checks truncated() where a result must be trusted (a
// worker after each copy, the coordinator every loop turn, the simulator
// before it verifies) and turns it into an error of that request, rank or
// instance. A SIGBUS anywhere else gets the handler that was there before,
// or the default action.
//
// The segments are shared by name (shm_open), so they cannot be sealed
// against shrinking (F_SEAL_SHRINK needs memfd_create and passing the
// descriptor); their size is also checked with fstat when they are mapped.
#pragma once

#include <cstddef>

namespace kvrelay {

class TruncationGuard {
 public:
  // Registers [base, base + bytes). Returns a handle for truncated() and
  // release(), or -1 when the registry is full (the mapping is then
  // unguarded, as before).
  static int watch(void* base, size_t bytes);
  static void release(int handle);
  // Whether a SIGBUS found the mapping truncated.
  static bool truncated(int handle);
};

}  // namespace kvrelay
