// The gather kernel's body (kernels/copy_slice.h) run on the CPU, warp by
// warp and lane by lane, against the host copy path (memcpy of the same
// runs): on random block lists planned the way the worker plans them, for
// every dtype, with and without fp8 scales, for head ranges (heterogeneous
// TP), and on unaligned runs that take the 8-, 4- and 1-byte paths.
#include "kernels/copy_slice.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/block_copy.h"
#include "kvrelay/pool_geometry.h"
#include "worker/copy_plan.h"

namespace kvrelay::kernels {
namespace {

// Runs every (warp, lane) of a grid of `warps` warps over the slices, in an
// order that is not the lanes' natural one (lanes of a real warp run in any
// order): the result must not depend on it.
void run_kernel_body(std::span<const CopySlice> slices, uint32_t warps) {
  for (uint32_t w = warps; w-- > 0;)
    for (uint32_t lane = 0; lane < kWarpLanes; ++lane)
      copy_slices_warp(slices.data(), static_cast<uint32_t>(slices.size()), w, warps,
                       (lane * 7) % kWarpLanes);
}

std::vector<std::byte> random_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<std::byte> out(n);
  for (auto& b : out)
    b = static_cast<std::byte>(rng());
  return out;
}

// Copies `runs` from src to a destination prefilled with `fill`, once with
// memcpy and once with the kernel body; both destinations must be equal,
// and (checked by the caller) equal where no run wrote.
struct TwoCopies {
  std::vector<std::byte> by_memcpy;
  std::vector<std::byte> by_kernel;
};

TwoCopies copy_both_ways(const std::vector<std::byte>& src, const std::vector<std::byte>& fill,
                         std::span<const CopyRun> runs, uint32_t warps, uint64_t max_slice) {
  TwoCopies out{fill, fill};
  copy_runs_host(src.data(), out.by_memcpy.data(), runs);
  std::vector<CopySlice> slices;
  append_slices(src.data(), out.by_kernel.data(), runs, slices, max_slice);
  uint64_t sliced = 0;
  for (const CopySlice& s : slices) {
    EXPECT_LE(s.bytes, std::max<uint64_t>(16, max_slice));
    sliced += s.bytes;
  }
  EXPECT_EQ(sliced, run_bytes(runs)) << "slices cover exactly the runs";
  run_kernel_body(slices, warps);
  return out;
}

// Random distinct block ids, partly consecutive (so some runs coalesce).
std::vector<uint32_t> random_blocks(uint32_t count, uint32_t pool_blocks, std::mt19937_64& rng) {
  std::vector<uint32_t> all(pool_blocks);
  std::iota(all.begin(), all.end(), 0U);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<uint32_t> out(all.begin(), all.begin() + count);
  // Sort a random stretch: consecutive ids there coalesce on both sides.
  const auto from = static_cast<std::ptrdiff_t>(rng() % count);
  std::sort(out.begin() + from, out.end());
  return out;
}

struct Shape {
  CacheDtype dtype;
  bool scales;
};

class KernelBodyAgainstMemcpy : public ::testing::TestWithParam<Shape> {};

TEST_P(KernelBodyAgainstMemcpy, EveryTensorOfRandomBlockListsMatchesByteForByte) {
  std::mt19937_64 rng(0x5eed + static_cast<uint64_t>(GetParam().dtype) * 2 + GetParam().scales);
  PoolGeometry g;
  g.num_layers = 1;
  g.num_blocks = 96;
  g.kv_heads = 2;
  g.block_size = 16;
  g.head_dim = 64;
  g.dtype = static_cast<uint32_t>(GetParam().dtype);
  g.has_scales = GetParam().scales ? 1 : 0;
  for (int round = 0; round < 20; ++round) {
    const uint32_t count = 1 + static_cast<uint32_t>(rng() % 64);
    const std::vector<uint32_t> src_ids = random_blocks(count, g.num_blocks, rng);
    const std::vector<uint32_t> dst_ids = random_blocks(count, g.num_blocks, rng);
    Result<std::vector<worker::BlockRun>> blocks =
        worker::plan_block_runs(src_ids, dst_ids, g.num_blocks, g.num_blocks, 0, 0);
    ASSERT_TRUE(blocks) << blocks.error().message;
    for (uint32_t t = 0; t < g.tensors_per_layer(); ++t) {
      const auto tensor = static_cast<PoolTensor>(t);
      const uint64_t tensor_bytes = g.tensor_bytes(0, tensor);
      std::vector<CopyRun> runs;
      worker::to_byte_runs(*blocks, g.block_bytes(tensor), runs);
      const std::vector<std::byte> src = random_bytes(tensor_bytes, rng);
      const std::vector<std::byte> fill = random_bytes(tensor_bytes, rng);
      // Small slices too, so that one block spans several warps.
      const uint64_t max_slice = round % 2 == 0 ? kMaxSliceBytes : 48 + rng() % 1024;
      const uint32_t warps = 1 + static_cast<uint32_t>(rng() % 13);
      const TwoCopies c = copy_both_ways(src, fill, runs, warps, max_slice);
      ASSERT_EQ(c.by_kernel, c.by_memcpy)
          << "round " << round << " tensor " << t << ": " << runs.size() << " runs, " << warps
          << " warps, slices of at most " << max_slice;
      // And the copy did something: each destination block holds its source.
      for (uint32_t i = 0; i < count; ++i) {
        const uint64_t b = g.block_bytes(tensor);
        ASSERT_TRUE(std::equal(src.begin() + static_cast<std::ptrdiff_t>(src_ids[i] * b),
                               src.begin() + static_cast<std::ptrdiff_t>((src_ids[i] + 1) * b),
                               c.by_kernel.begin() + static_cast<std::ptrdiff_t>(dst_ids[i] * b)))
            << "block " << src_ids[i] << " -> " << dst_ids[i];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, KernelBodyAgainstMemcpy,
    ::testing::Values(Shape{CacheDtype::kBf16, false}, Shape{CacheDtype::kFp16, false},
                      Shape{CacheDtype::kUint8, false}, Shape{CacheDtype::kFp8, false},
                      Shape{CacheDtype::kFp8, true}, Shape{CacheDtype::kUint8, true}),
    [](const auto& shape) {
      return std::string(dtype_name(shape.param.dtype)) + (shape.param.scales ? "_scales" : "");
    });

TEST(KernelBody, HeadRangesOfHeterogeneousTpMatchMemcpy) {
  std::mt19937_64 rng(42);
  // Prefill blocks of 4 heads into decode blocks of 2: heads [2, 4) -> [0, 2).
  const uint64_t head_bytes = 16 * 64 * 2;
  const uint64_t src_block = 4 * head_bytes;
  const uint64_t dst_block = 2 * head_bytes;
  const std::vector<uint32_t> src_ids = random_blocks(20, 40, rng);
  const std::vector<uint32_t> dst_ids = random_blocks(20, 40, rng);
  Result<std::vector<worker::BlockRun>> blocks =
      worker::plan_block_runs(src_ids, dst_ids, 40, 40, 0, 0);
  ASSERT_TRUE(blocks);
  HeadShare share;
  share.src_head = 2;
  share.dst_head = 0;
  share.heads = 2;
  std::vector<CopyRun> runs;
  worker::to_head_runs(*blocks, src_block, dst_block, head_bytes, share, runs);
  const std::vector<std::byte> src = random_bytes(40 * src_block, rng);
  const std::vector<std::byte> fill = random_bytes(40 * dst_block, rng);
  const TwoCopies c = copy_both_ways(src, fill, runs, 5, kMaxSliceBytes);
  EXPECT_EQ(c.by_kernel, c.by_memcpy);
}

TEST(KernelBody, UnalignedRunsTakeNarrowerVectorsAndStillMatch) {
  std::mt19937_64 rng(7);
  const size_t n = 1 << 16;
  const std::vector<std::byte> src = random_bytes(n, rng);
  const std::vector<std::byte> fill = random_bytes(n, rng);
  // Alignments of 8, 4, 2 and 1 bytes (offsets and lengths), non-overlapping
  // on the destination side.
  for (uint64_t align : {8U, 4U, 2U, 1U}) {
    std::vector<CopyRun> runs;
    uint64_t dst = align;
    while (dst + 2000 < n) {
      const uint64_t bytes = align * (1 + rng() % (1500 / align));
      const uint64_t src_off = align * (rng() % ((n - bytes) / align));
      runs.push_back(CopyRun{src_off, dst, bytes});
      dst += bytes + align * (1 + rng() % 8);
    }
    const TwoCopies c = copy_both_ways(src, fill, runs, 3, 256 + align);
    EXPECT_EQ(c.by_kernel, c.by_memcpy) << "alignment " << align;
  }
}

TEST(KernelBody, SlicesKeepSixteenByteAlignmentWhenCutting) {
  std::vector<std::byte> src(1 << 20);
  std::vector<std::byte> dst(1 << 20);
  const CopyRun run{4096, 8192, 300'000};
  std::vector<CopySlice> slices;
  append_slices(src.data(), dst.data(), std::span<const CopyRun>(&run, 1), slices, 1000);
  ASSERT_GT(slices.size(), 1U);
  for (size_t i = 0; i + 1 < slices.size(); ++i) {
    EXPECT_EQ(slices[i].bytes % 16, 0U) << "a cut inside a run keeps the vectors aligned";
    EXPECT_EQ(slices[i].bytes, 992U);  // 1000 rounded down to a multiple of 16
  }
}

TEST(KernelBody, EmptyRunsMakeNoSlices) {
  std::vector<std::byte> buf(64);
  const CopyRun run{0, 0, 0};
  std::vector<CopySlice> slices;
  append_slices(buf.data(), buf.data(), std::span<const CopyRun>(&run, 1), slices);
  EXPECT_TRUE(slices.empty());
}

}  // namespace
}  // namespace kvrelay::kernels
