#include "kv_pattern.h"

#include <algorithm>
#include <cstring>

namespace kvrelay::sim {

namespace {

constexpr uint64_t kPoison = 0xDEADBEEFCAFEF00DULL;

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

uint64_t seed_of(const BlockTag& t) {
  uint64_t s = splitmix(t.request);
  s = splitmix(s ^ (uint64_t{t.layer} << 32 | t.tensor));
  s = splitmix(s ^ (uint64_t{t.index} << 32 | t.rank));
  return s;
}

}  // namespace

bool fill_block(const PoolView& pool, uint32_t block_id, const BlockTag& tag) {
  std::byte* p = pool.block(tag.layer, static_cast<PoolTensor>(tag.tensor), block_id);
  if (p == nullptr) return false;
  const uint64_t bytes = pool.geometry().block_bytes(static_cast<PoolTensor>(tag.tensor));
  const uint64_t seed = seed_of(tag);
  for (uint64_t w = 0; w < bytes / 8; ++w) {
    const uint64_t v = seed ^ (w * 0x9E3779B97F4A7C15ULL);
    std::memcpy(p + w * 8, &v, 8);
  }
  return true;
}

uint64_t check_block(const PoolView& pool, uint32_t block_id, const BlockTag& tag) {
  const std::byte* p = pool.block(tag.layer, static_cast<PoolTensor>(tag.tensor), block_id);
  const uint64_t bytes = pool.geometry().block_bytes(static_cast<PoolTensor>(tag.tensor));
  if (p == nullptr) return bytes / 8;
  const uint64_t seed = seed_of(tag);
  uint64_t wrong = 0;
  for (uint64_t w = 0; w < bytes / 8; ++w) {
    uint64_t v = 0;
    std::memcpy(&v, p + w * 8, 8);
    wrong += v != (seed ^ (w * 0x9E3779B97F4A7C15ULL)) ? 1 : 0;
  }
  return wrong;
}

void poison_block(const PoolView& pool, uint32_t layer, uint32_t tensor, uint32_t block_id) {
  std::byte* p = pool.block(layer, static_cast<PoolTensor>(tensor), block_id);
  if (p == nullptr) return;
  const uint64_t bytes = pool.geometry().block_bytes(static_cast<PoolTensor>(tensor));
  for (uint64_t w = 0; w < bytes / 8; ++w)
    std::memcpy(p + w * 8, &kPoison, 8);
}

bool block_is_poisoned(const PoolView& pool, uint32_t layer, uint32_t tensor, uint32_t block_id) {
  const std::byte* p = pool.block(layer, static_cast<PoolTensor>(tensor), block_id);
  if (p == nullptr) return false;
  const uint64_t bytes = pool.geometry().block_bytes(static_cast<PoolTensor>(tensor));
  for (uint64_t w = 0; w < bytes / 8; ++w) {
    uint64_t v = 0;
    std::memcpy(&v, p + w * 8, 8);
    if (v != kPoison) return false;
  }
  return true;
}

}  // namespace kvrelay::sim

namespace kvrelay::sim {

void fill_request(const PoolView& pool, uint32_t rank, const RequestBlocks& r) {
  const PoolGeometry& g = pool.geometry();
  for (uint32_t layer = 0; layer < g.total_layers(); ++layer)
    for (uint32_t t : tensor_ids(g))
      for (uint32_t i = 0; i < r.src.size(); ++i)
        fill_block(pool, r.src[i], BlockTag{r.tag, layer, t, i, rank});
}

uint64_t check_request(const PoolView& pool, uint32_t rank, const RequestBlocks& r) {
  const PoolGeometry& g = pool.geometry();
  uint64_t wrong = 0;
  for (uint32_t layer = 0; layer < g.total_layers(); ++layer)
    for (uint32_t t : tensor_ids(g))
      for (uint32_t j = 0; j < r.dst.size(); ++j)
        wrong += check_block(pool, r.dst[j], BlockTag{r.tag, layer, t, r.prefix() + j, rank});
  return wrong;
}

namespace {

// A head's tag: the rank field names the model head, marked so that no
// rank's whole-block pattern equals it.
constexpr uint32_t kHeadMark = 1u << 31;

// Fills or checks `bytes` at `p` with the pattern of `seed`, word by word
// (a head's bytes need not be a multiple of 8: the last word is cut).
uint64_t pattern_range(std::byte* fill, const std::byte* check, uint64_t bytes, uint64_t seed) {
  uint64_t wrong = 0;
  for (uint64_t at = 0; at < bytes; at += 8) {
    const uint64_t v = seed ^ ((at / 8) * 0x9E3779B97F4A7C15ULL);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(8, bytes - at));
    if (fill != nullptr) {
      std::memcpy(fill + at, &v, n);
    } else if (std::memcmp(check + at, &v, n) != 0) {
      ++wrong;
    }
  }
  return wrong;
}

uint64_t heads_of_block(const PoolView& pool, uint32_t block_id, BlockTag tag, uint32_t first_head,
                        bool fill) {
  const auto tensor = static_cast<PoolTensor>(tag.tensor);
  std::byte* p = pool.block(tag.layer, tensor, block_id);
  const PoolGeometry& g = pool.geometry();
  const uint64_t head_bytes = g.block_bytes(tensor) / g.kv_heads;
  if (p == nullptr) return g.block_bytes(tensor) / 8;
  uint64_t wrong = 0;
  for (uint32_t h = 0; h < g.kv_heads; ++h) {
    tag.rank = kHeadMark | (first_head + h);
    wrong += pattern_range(fill ? p + h * head_bytes : nullptr, p + h * head_bytes, head_bytes,
                           seed_of(tag));
  }
  return wrong;
}

}  // namespace

void fill_block_heads(const PoolView& pool, uint32_t block_id, const BlockTag& tag,
                      uint32_t first_head) {
  heads_of_block(pool, block_id, tag, first_head, true);
}

uint64_t check_block_heads(const PoolView& pool, uint32_t block_id, const BlockTag& tag,
                           uint32_t first_head) {
  return heads_of_block(pool, block_id, tag, first_head, false);
}

void fill_blocks_heads(const PoolView& pool, uint32_t first_head, const RequestBlocks& r,
                       uint32_t layer, uint32_t first, uint32_t last) {
  for (uint32_t t : tensor_ids(pool.geometry()))
    for (uint32_t i = first; i < last; ++i)
      heads_of_block(pool, r.src[i], BlockTag{r.tag, layer, t, i, 0}, first_head, true);
}

void fill_request_heads(const PoolView& pool, uint32_t first_head, const RequestBlocks& r) {
  for (uint32_t layer = 0; layer < pool.geometry().total_layers(); ++layer)
    fill_blocks_heads(pool, first_head, r, layer, 0, static_cast<uint32_t>(r.src.size()));
}

uint64_t check_request_heads(const PoolView& pool, uint32_t first_head, const RequestBlocks& r) {
  const PoolGeometry& g = pool.geometry();
  uint64_t wrong = 0;
  for (uint32_t layer = 0; layer < g.total_layers(); ++layer)
    for (uint32_t t : tensor_ids(g))
      for (uint32_t j = 0; j < r.dst.size(); ++j)
        wrong += heads_of_block(pool, r.dst[j], BlockTag{r.tag, layer, t, r.prefix() + j, 0},
                                first_head, false);
  return wrong;
}

}  // namespace kvrelay::sim
