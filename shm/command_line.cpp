#include "shm/command_line.h"

namespace kvrelay {

// Defined for this library alone (shm/CMakeLists.txt), so that a new
// version rebuilds one file's worth, not every program.
const char* version() {
  return KVRELAY_VERSION_STRING;
}

}  // namespace kvrelay
