#include "worker/pool_compatibility.h"

#include <fmt/format.h>

#include <tuple>

namespace kvrelay::worker {

namespace {
const char* kind_of(const PoolGeometry& g) {
  return g.k_only != 0 ? "K only (an MLA latent cache)" : "K and V";
}
}  // namespace

Status check_compatible(const PoolGeometry& local, const PoolGeometry& peer) {
  if (local.k_only != peer.k_only)
    return make_error(Errc::kLayoutMismatch,
                      fmt::format("pools differ in kind: {} here, {} at the peer", kind_of(local),
                                  kind_of(peer)));
  const struct {
    const char* what;
    uint64_t mine;
    uint64_t theirs;
  } fields[] = {{"layers", local.total_layers(), peer.total_layers()},
                {"kv_heads", local.kv_heads, peer.kv_heads},
                {"block_size", local.block_size, peer.block_size},
                {"head_dim", local.head_dim, peer.head_dim},
                {"dtype", local.dtype, peer.dtype},
                {"has_scales", local.has_scales, peer.has_scales}};
  for (const auto& f : fields) {
    if (f.mine != f.theirs)
      return make_error(
          Errc::kLayoutMismatch,
          fmt::format("pools differ in {}: {} here, {} at the peer", f.what, f.mine, f.theirs));
  }
  return {};
}

Status check_compatible(const PoolGeometry& local, const HeadLayout& local_heads,
                        const PoolGeometry& peer, const HeadLayout& peer_heads) {
  // The kind first: an MLA cache against a GQA one differs in heads too, and
  // the kind is what the operator got wrong.
  if (local.k_only != peer.k_only) return check_compatible(local, peer);
  if (local_heads.total_heads != peer_heads.total_heads)
    return make_error(Errc::kLayoutMismatch,
                      fmt::format("pools differ in the model's KV heads: {} here (tp {}), {} at "
                                  "the peer (tp {})",
                                  local_heads.total_heads, local_heads.tp_size,
                                  peer_heads.total_heads, peer_heads.tp_size));
  for (const auto& [pool, heads, where] :
       {std::tuple{&local, &local_heads, "here"}, std::tuple{&peer, &peer_heads, "at the peer"}}) {
    if (pool->kv_heads != heads->heads_per_rank)
      return make_error(Errc::kLayoutMismatch,
                        fmt::format("the pool {} holds {} KV heads per block, but its instance "
                                    "gives each rank {}",
                                    where, pool->kv_heads, heads->heads_per_rank));
  }
  PoolGeometry same_heads = peer;
  same_heads.kv_heads = local.kv_heads;  // the rest must match field for field
  return check_compatible(local, same_heads);
}

}  // namespace kvrelay::worker
