#include "worker/pool_compatibility.h"

#include <fmt/format.h>

namespace kvrelay::worker {

Status check_compatible(const PoolGeometry& local, const PoolGeometry& peer) {
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

}  // namespace kvrelay::worker
