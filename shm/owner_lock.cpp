#include "shm/owner_lock.h"

#include <fcntl.h>

namespace kvrelay {

namespace {

struct flock one_byte(short type, uint64_t offset) {
  struct flock f {};
  f.l_type = type;
  f.l_whence = SEEK_SET;
  f.l_start = static_cast<off_t>(offset);
  f.l_len = 1;
  f.l_pid = 0;  // required by F_OFD_*
  return f;
}

}  // namespace

const char* lock_state_name(LockState s) {
  switch (s) {
    case LockState::kHeld: return "held";
    case LockState::kFree: return "free";
    case LockState::kUnknown: return "unknown";
  }
  return "unknown";
}

bool LockSpace::try_lock(uint64_t offset) const {
  if (fd < 0) return true;
  struct flock f = one_byte(F_WRLCK, base + offset);
  return fcntl(fd, F_OFD_SETLK, &f) == 0;
}

void LockSpace::unlock(uint64_t offset) const {
  if (fd < 0) return;
  struct flock f = one_byte(F_UNLCK, base + offset);
  (void)fcntl(fd, F_OFD_SETLK, &f);
}

LockState LockSpace::probe(uint64_t offset) const {
  if (fd < 0) return LockState::kUnknown;
  struct flock f = one_byte(F_WRLCK, base + offset);
  if (fcntl(fd, F_OFD_GETLK, &f) != 0) return LockState::kUnknown;
  return f.l_type == F_UNLCK ? LockState::kFree : LockState::kHeld;
}

}  // namespace kvrelay
