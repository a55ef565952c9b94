#include "instance/head_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace kvrelay {

Status HeadLayout::check() const {
  if (tp_size == 0 || heads_per_rank == 0 || total_heads == 0)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("tp_size {}, kv_heads {} per rank and {} KV heads in all: none "
                                  "may be 0",
                                  tp_size, heads_per_rank, total_heads));
  if (uint64_t{heads_per_rank} * tp_size == total_heads) return {};
  if (heads_per_rank == 1 && tp_size > total_heads && tp_size % total_heads == 0) return {};
  return make_error(
      Errc::kInvalidArgument,
      fmt::format("{} KV heads in all cannot be spread over tp {} with {} heads per rank: "
                  "kv_heads x tp_size must equal the total, or (fewer heads than ranks) "
                  "kv_heads must be 1 and tp_size a multiple of the total",
                  total_heads, tp_size, heads_per_rank));
}

HeadLayout head_layout_of(const InstanceConfig& config) {
  const uint32_t total = config.total_kv_heads;
  return HeadLayout{config.tp_size, config.kv_heads,
                    total != 0 ? total : config.kv_heads * config.tp_size};
}

namespace {

// The prefill rank that sends head `head` to `decode_rank`.
uint32_t sender_of(const HeadLayout& prefill, uint32_t head, uint32_t decode_rank) {
  if (prefill.replicas() == 1) return head / prefill.heads_per_rank;
  return head * prefill.replicas() + decode_rank % prefill.replicas();
}

}  // namespace

std::vector<HeadShare> head_shares(const HeadLayout& prefill, uint32_t prefill_rank,
                                   const HeadLayout& decode) {
  std::vector<HeadShare> shares;
  const uint32_t p_first = prefill.first_head(prefill_rank);
  for (uint32_t d = 0; d < decode.tp_size; ++d) {
    const uint32_t d_first = decode.first_head(d);
    for (uint32_t i = 0; i < decode.heads_per_rank; ++i) {
      const uint32_t head = d_first + i;
      if (sender_of(prefill, head, d) != prefill_rank) continue;
      const uint32_t src = head - p_first;
      if (!shares.empty()) {
        HeadShare& last = shares.back();
        if (last.decode_rank == d && last.src_head + last.heads == src &&
            last.dst_head + last.heads == i) {
          ++last.heads;
          continue;
        }
      }
      shares.push_back(HeadShare{d, src, i, 1});
    }
  }
  return shares;
}

uint32_t senders_of(const HeadLayout& prefill, const HeadLayout& decode, uint32_t decode_rank) {
  std::set<uint32_t> ranks;
  const uint32_t first = decode.first_head(decode_rank);
  for (uint32_t i = 0; i < decode.heads_per_rank; ++i)
    ranks.insert(sender_of(prefill, first + i, decode_rank));
  return static_cast<uint32_t>(ranks.size());
}

}  // namespace kvrelay
