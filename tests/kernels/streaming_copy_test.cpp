// The host copy's streaming stores (kernels/streaming_copy.h): every byte
// lands, at every alignment of source and destination and every length
// around the 16- and 64-byte boundaries it splits at, and nothing beside the
// destination is touched; copy_runs_host streams long runs and copies
// short ones, and both land.
#include "kernels/streaming_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/block_copy.h"

namespace kvrelay::kernels {
namespace {

std::vector<std::byte> pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 131 + seed) & 0xFF);
  return v;
}

TEST(StreamingCopy, EveryAlignmentAndLengthLandsExactlyAndTouchesNothingElse) {
  constexpr size_t kGuard = 80;
  const std::vector<std::byte> src = pattern(1024, 7);
  for (size_t src_at = 0; src_at < 64; src_at += 5)
    for (size_t dst_at = 0; dst_at < 64; ++dst_at)
      for (size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 200, 511, 700}) {
        std::vector<std::byte> dst(kGuard + 64 + n + kGuard, std::byte{0xEE});
        streaming_copy(dst.data() + kGuard + dst_at, src.data() + src_at, n);
        streaming_copy_fence();
        ASSERT_EQ(std::memcmp(dst.data() + kGuard + dst_at, src.data() + src_at, n), 0)
            << "src +" << src_at << " dst +" << dst_at << " " << n << " bytes";
        for (size_t i = 0; i < dst.size(); ++i) {
          if (i >= kGuard + dst_at && i < kGuard + dst_at + n) continue;
          ASSERT_EQ(dst[i], std::byte{0xEE})
              << "byte " << i << " outside the copy, " << n << " bytes at dst +" << dst_at;
        }
      }
}

TEST(StreamingCopy, RunsLongAndShortAllLand) {
  // A layer's worth of blocks: runs of 16 KiB and 1 MiB (streamed) beside
  // runs of a few head slices (memcpy), scattered over the destination.
  const std::vector<std::byte> src = pattern(4 << 20, 3);
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
