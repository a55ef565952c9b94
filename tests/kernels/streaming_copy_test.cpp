// The host copy's streaming stores (kernels/streaming_copy.h), each kind
// this CPU can run: every byte lands, at every alignment of source and
// destination and every length around the 16-, 32- and 64-byte boundaries
// they split at, and nothing beside the destination is touched;
// copy_runs_host streams long runs and copies short ones, and both land.
#include "kernels/streaming_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>
#include <vector>

#include "kernels/block_copy.h"
#include "support/byte_pattern.h"

namespace kvrelay::kernels {
namespace {

using testing::byte_pattern;

std::vector<StreamingStores> available_kinds() {
  std::vector<StreamingStores> kinds;
  for (StreamingStores k :
       {StreamingStores::kNone, StreamingStores::kSse2, StreamingStores::kAvx2}) {
    if (streaming_stores_available(k)) kinds.push_back(k);
  }
  return kinds;
}

TEST(StreamingCopy, EveryAlignmentAndLengthLandsExactlyAndTouchesNothingElse) {
  // Untouched bytes around every copy: two lines before, at least one after.
  constexpr size_t kBefore = 128;
  constexpr size_t kLongest = 700;
  const std::vector<std::byte> src = byte_pattern(1024, 7);
  for (StreamingStores kind : available_kinds())
    for (size_t src_at = 0; src_at < 64; src_at += 5)
      for (size_t dst_at = 0; dst_at < 64; ++dst_at)
        for (size_t n : std::initializer_list<size_t>{0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127,
                                                      128, 129, 200, 511, kLongest}) {
          // 64-byte aligned, so that dst_at is the offset from a line.
          alignas(64) std::byte dst[kBefore + 64 + kLongest + 64];
          std::memset(dst, 0xEE, sizeof(dst));
          std::byte* at = dst + kBefore + dst_at;
          streaming_copy_with(kind, at, src.data() + src_at, n);
          streaming_copy_fence();
          ASSERT_EQ(std::memcmp(at, src.data() + src_at, n), 0)
              << streaming_stores_name(kind) << ": src +" << src_at << " dst +" << dst_at << " "
              << n << " bytes";
          for (size_t i = 0; i < sizeof(dst); ++i) {
            if (dst + i >= at && dst + i < at + n) continue;
            ASSERT_EQ(dst[i], std::byte{0xEE})
                << streaming_stores_name(kind) << ": byte " << i << " outside the copy, " << n
                << " bytes at dst +" << dst_at;
          }
        }
}

TEST(StreamingCopy, ThisProcessUsesTheWidestStoresItCanRun) {
  const StreamingStores used = streaming_stores();
  EXPECT_TRUE(streaming_stores_available(used)) << streaming_stores_name(used);
  if (streaming_stores_available(StreamingStores::kAvx2)) {
    EXPECT_EQ(used, StreamingStores::kAvx2);
  }
  // streaming_copy() goes through it: a copy of a few lines lands.
  const std::vector<std::byte> src = byte_pattern(4096 + 17, 9);
  std::vector<std::byte> dst(src.size() + 3, std::byte{0});
  streaming_copy(dst.data() + 3, src.data(), src.size());
  streaming_copy_fence();
  EXPECT_EQ(std::memcmp(dst.data() + 3, src.data(), src.size()), 0);
}

TEST(StreamingCopy, RunsLongAndShortAllLand) {
  // A layer's worth of blocks: runs of 16 KiB and 1 MiB (streamed) beside
  // runs of a few head slices (memcpy), scattered over the destination.
  const std::vector<std::byte> src = byte_pattern(4 << 20, 3);
  std::vector<std::byte> dst(8 << 20, std::byte{0});
  const std::vector<CopyRun> runs = {{0, 5 << 20, 16 << 10},
                                     {16 << 10, 64, 1 << 20},
                                     {(1 << 20) + (16 << 10), (3 << 20) + 8, 256},
                                     {2 << 20, (6 << 20) + 1, kStreamingRunBytes},
                                     {3 << 20, (7 << 20) + 3, kStreamingRunBytes - 1}};
  copy_runs_host(src.data(), dst.data(), runs);
  for (const CopyRun& r : runs)
    EXPECT_EQ(std::memcmp(dst.data() + r.dst_offset, src.data() + r.src_offset, r.bytes), 0)
        << r.bytes << " bytes to " << r.dst_offset;
  EXPECT_EQ(run_bytes(runs), (16 << 10) + (1 << 20) + 256 + 2 * kStreamingRunBytes - 1);
}

}  // namespace
}  // namespace kvrelay::kernels
