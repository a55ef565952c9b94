#include "shm/huge_pages.h"

#include <sys/mman.h>

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace kvrelay {

void advise_huge_pages(void* start, size_t bytes) {
#ifdef MADV_HUGEPAGE
  if (bytes >= kHugePageBytes) (void)madvise(start, bytes, MADV_HUGEPAGE);
#else
  (void)start;
  (void)bytes;
#endif
}

uint64_t huge_page_mapped_bytes(const void* start) {
  std::ifstream smaps("/proc/self/smaps");
  const auto want = reinterpret_cast<uintptr_t>(start);
  std::string line;
  bool inside = false;
  uint64_t kib = 0;
  while (std::getline(smaps, line)) {
    // A mapping's first line: "start-end perms offset dev inode path".
    uintptr_t from = 0, to = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &from, &to) == 2 &&
        line.find(':') > line.find(' ')) {
      if (inside) break;
      inside = from == want;
      continue;
    }
    if (!inside) continue;
    uint64_t value = 0;
    // Shared memory (tmpfs) reports ShmemPmdMapped; other files FilePmdMapped.
    if (std::sscanf(line.c_str(), "ShmemPmdMapped: %" SCNu64 " kB", &value) == 1 ||
        std::sscanf(line.c_str(), "FilePmdMapped: %" SCNu64 " kB", &value) == 1)
      kib += value;
  }
  return kib * 1024;
}

std::string tmpfs_huge_option(const std::string& mount_point) {
  std::ifstream mounts("/proc/self/mounts");
  std::string line;
  std::string found;
  while (std::getline(mounts, line)) {
    std::istringstream fields(line);
    std::string device, where, type, options;
    if (!(fields >> device >> where >> type >> options)) continue;
    if (where != mount_point || type != "tmpfs") continue;
    // The last mount at a point is the one in effect.
    found = "never";
    std::istringstream each(options);
    std::string option;
    while (std::getline(each, option, ','))
      if (option.rfind("huge=", 0) == 0) found = option.substr(5);
  }
  return found;
}

}  // namespace kvrelay
