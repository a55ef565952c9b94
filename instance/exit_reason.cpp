#include "instance/exit_reason.h"

#include <algorithm>
#include <cstring>

namespace kvrelay {

void write_exit_reason(InstanceStatus& status, uint32_t rank, std::string_view why) {
  char* slot = status.exit_reason[rank];
  std::memset(slot, 0, kExitReasonBytes);
  std::memcpy(slot, why.data(), std::min(why.size(), kExitReasonBytes - 1));
}

std::string read_exit_reason(const InstanceStatus& status, uint32_t rank) {
  char buf[kExitReasonBytes];
  std::memcpy(buf, status.exit_reason[rank], sizeof(buf));
  buf[sizeof(buf) - 1] = '\0';
  std::string out;
  for (const char* p = buf; *p != '\0'; ++p)
    out.push_back(*p >= 0x20 && *p < 0x7f ? *p : '?');
  return out;
}

void clear_exit_reason(InstanceStatus& status, uint32_t rank) {
  std::memset(status.exit_reason[rank], 0, kExitReasonBytes);
}

}  // namespace kvrelay
