// Huge pages for large segments (shm/huge_pages.h): a segment of 2 MiB or
// more lands on huge pages where /dev/shm is mounted for them, a smaller one
// and any segment under `huge=never` on small pages, and the mount option an
// operator is told about is read right. Each case runs in a child with its
// own mount namespace and its own tmpfs at /dev/shm, so the host's mount is
// neither needed nor touched.
#include "shm/huge_pages.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "shm/segment.h"

namespace kvrelay {
namespace {

constexpr int kSkipped = 77;

// Runs `body` in a child whose /dev/shm is a fresh tmpfs mounted with
// `options`; the child's exit code is body's (kSkipped when the namespace or
// mount is refused). The body reports what failed on stderr.
int in_own_dev_shm(const char* options, const std::function<int()>& body) {
  const pid_t child = fork();
  if (child == 0) {
    if (unshare(CLONE_NEWNS) != 0 ||
        mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", 0, options) != 0) {
      std::fprintf(stderr, "cannot mount a tmpfs of our own: %s\n", std::strerror(errno));
      _exit(kSkipped);
    }
    _exit(body());
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

bool kernel_has_shmem_huge_pages() {
  return access("/sys/kernel/mm/transparent_hugepage/shmem_enabled", F_OK) == 0;
}

// Creates a segment of `bytes`, writes it, and returns the bytes on huge
// pages (or -1 when it could not be made).
int64_t segment_on_huge_pages(size_t bytes) {
  const std::string name = "kvrelay-test-huge-" + std::to_string(getpid());
  auto seg = SharedSegment::create(name, bytes);
  if (!seg) {
    std::fprintf(stderr, "create: %s\n", seg.error().message.c_str());
    return -1;
  }
  std::memset(seg->data(), 0x5A, seg->size());
  const auto huge = static_cast<int64_t>(seg->huge_page_bytes());
  (void)SharedSegment::unlink(name);
  return huge;
}

TEST(HugePages, ALargeSegmentLandsOnHugePagesWhereTheMountAllowsIt) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a mount namespace of its own";
  if (!kernel_has_shmem_huge_pages())
    GTEST_SKIP() << "this kernel has no transparent huge pages for shared memory";
  const int code = in_own_dev_shm("huge=advise,size=64m", [] {
    if (tmpfs_huge_option() != "advise") {
      std::fprintf(stderr, "the mount reads as huge=%s\n", tmpfs_huge_option().c_str());
      return 1;
    }
    // 8 MiB: four huge pages; one is enough to show the mapping asked
    // (memory too fragmented for all of them is the kernel's business).
    const int64_t large = segment_on_huge_pages(8 << 20);
    if (large < static_cast<int64_t>(kHugePageBytes)) {
      std::fprintf(stderr, "an 8 MiB segment has %lld bytes on huge pages\n",
                   static_cast<long long>(large));
      return 2;
    }
    // Below the threshold nothing is asked: small pages.
    const int64_t small = segment_on_huge_pages(1 << 20);
    if (small != 0) {
      std::fprintf(stderr, "a 1 MiB segment has %lld bytes on huge pages\n",
                   static_cast<long long>(small));
      return 3;
    }
    return 0;
  });
  if (code == kSkipped) GTEST_SKIP() << "no mount namespace here (a container without the right)";
  EXPECT_EQ(code, 0) << "see the child's stderr";
}

TEST(HugePages, UnderHugeNeverEverySegmentStaysOnSmallPagesAndTheOptionSaysSo) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a mount namespace of its own";
  const int code = in_own_dev_shm("size=64m", [] {
    if (tmpfs_huge_option() != "never") {
      std::fprintf(stderr, "a mount without huge= reads as huge=%s\n", tmpfs_huge_option().c_str());
      return 1;
    }
    const int64_t large = segment_on_huge_pages(8 << 20);
    if (large != 0) {
      std::fprintf(stderr, "an 8 MiB segment has %lld bytes on huge pages under huge=never\n",
                   static_cast<long long>(large));
      return 2;
    }
    return 0;
  });
  if (code == kSkipped) GTEST_SKIP() << "no mount namespace here (a container without the right)";
  EXPECT_EQ(code, 0) << "see the child's stderr";
}

TEST(HugePages, NothingMountedAtAPointReadsAsNoOption) {
  EXPECT_EQ(tmpfs_huge_option("/no/such/mount/point"), "");
  int on_stack = 0;
  EXPECT_EQ(huge_page_mapped_bytes(&on_stack), 0u) << "not the start of a mapping";
}

}  // namespace
}  // namespace kvrelay
