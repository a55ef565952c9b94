// Mapping a segment (shm/segment.h): a writer's mapping is populated at
// once, so that copies never fault; an observer's read-only mapping is not,
// so that kvrelay-dump, or a creator checking a leftover pool, neither walks
// nor allocates the pages of a pool of many GiB.
#include "shm/segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace kvrelay {
namespace {

constexpr size_t kBytes = size_t{64} << 20;

// A segment sized by a creator that died before it wrote a byte: a sparse
// file of kBytes.
class SparseSegment : public ::testing::Test {
 protected:
  void SetUp() override {
    (void)SharedSegment::unlink(name_);  // a crashed run's, with our pid
    const int fd = shm_open(("/" + name_).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(kBytes)), 0);
    close(fd);
  }
  void TearDown() override { (void)SharedSegment::unlink(name_); }

  // Bytes of the file that memory backs now.
  uint64_t allocated() const {
    struct stat st {};
    if (stat(("/dev/shm/" + name_).c_str(), &st) != 0) return UINT64_MAX;
    return static_cast<uint64_t>(st.st_blocks) * 512;
  }

  const std::string name_ = "kvrelay-test-segment-" + std::to_string(getpid());
};

TEST_F(SparseSegment, AnObserversReadOnlyMappingAllocatesOnlyWhatItReads) {
  auto seg = SharedSegment::open(name_, SegmentAccess::kReadOnly);
  ASSERT_TRUE(seg.ok()) << seg.error().message;
  EXPECT_EQ(seg->size(), kBytes);
  EXPECT_LT(allocated(), uint64_t{1} << 20) << "the whole segment was faulted in";
  // What it reads is there (zeros: nothing was written).
  EXPECT_EQ(static_cast<int>(seg->data()[0]), 0);
  EXPECT_EQ(static_cast<int>(seg->data()[kBytes - 1]), 0);
  EXPECT_FALSE(seg->truncated());
}

TEST_F(SparseSegment, AWritersMappingIsPopulatedAtOnce) {
  auto seg = SharedSegment::open(name_, SegmentAccess::kReadWrite);
  ASSERT_TRUE(seg.ok()) << seg.error().message;
  EXPECT_GE(allocated(), kBytes) << "copies into it would fault";
}

}  // namespace
}  // namespace kvrelay
