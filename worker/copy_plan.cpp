#include "worker/copy_plan.h"

#include <fmt/format.h>

namespace kvrelay::worker {

Result<std::vector<BlockRun>> plan_block_runs(std::span<const uint32_t> src,
                                              std::span<const uint32_t> dst, uint32_t src_blocks,
                                              uint32_t dst_blocks, uint32_t rank, uint32_t layer) {
  std::vector<BlockRun> runs;
  if (Status s = plan_block_runs(src, dst, src_blocks, dst_blocks, rank, layer, runs); !s)
    return s.error();
  return runs;
}

Status plan_block_runs(std::span<const uint32_t> src, std::span<const uint32_t> dst,
                       uint32_t src_blocks, uint32_t dst_blocks, uint32_t rank, uint32_t layer,
                       std::vector<BlockRun>& runs) {
  runs.clear();
  if (src.size() != dst.size())
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("{} source blocks but {} destination blocks", src.size(), dst.size()));
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] >= src_blocks)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("source block id {} out of range: pool has {} blocks (rank {}, "
                                    "layer {})",
                                    src[i], src_blocks, rank, layer));
    if (dst[i] >= dst_blocks)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("destination block id {} out of range: pool has {} blocks "
                                    "(rank {}, layer {})",
                                    dst[i], dst_blocks, rank, layer));
    if (!runs.empty()) {
      BlockRun& last = runs.back();
      if (src[i] == last.src_block + last.count && dst[i] == last.dst_block + last.count) {
        ++last.count;
        continue;
      }
    }
    runs.push_back(BlockRun{src[i], dst[i], 1});
  }
  return {};
}

void to_byte_runs(std::span<const BlockRun> runs, uint64_t block_bytes,
                  std::vector<kernels::CopyRun>& out) {
  out.clear();
  out.reserve(runs.size());
  for (const BlockRun& r : runs) {
    out.push_back(kernels::CopyRun{uint64_t{r.src_block} * block_bytes,
                                   uint64_t{r.dst_block} * block_bytes,
                                   uint64_t{r.count} * block_bytes});
  }
}

void to_head_runs(std::span<const BlockRun> runs, uint64_t src_block_bytes,
                  uint64_t dst_block_bytes, uint64_t head_bytes, const HeadShare& share,
                  std::vector<kernels::CopyRun>& out) {
  const uint64_t bytes = uint64_t{share.heads} * head_bytes;
  if (bytes == src_block_bytes && bytes == dst_block_bytes)
    return to_byte_runs(runs, src_block_bytes, out);
  out.clear();
  const uint64_t src_at = uint64_t{share.src_head} * head_bytes;
  const uint64_t dst_at = uint64_t{share.dst_head} * head_bytes;
  for (const BlockRun& r : runs) {
    for (uint32_t i = 0; i < r.count; ++i)
      out.push_back(kernels::CopyRun{uint64_t{r.src_block + i} * src_block_bytes + src_at,
                                     uint64_t{r.dst_block + i} * dst_block_bytes + dst_at, bytes});
  }
}

}  // namespace kvrelay::worker
