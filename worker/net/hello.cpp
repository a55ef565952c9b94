#include "worker/net/hello.h"

#include <fmt/format.h>

#include "worker/pool_compatibility.h"

namespace kvrelay::worker::net {

HeadLayout sender_layout(const Hello& hello) {
  return HeadLayout{
      hello.tp_size, hello.pool.kv_heads,
      hello.total_kv_heads != 0 ? hello.total_kv_heads : hello.pool.kv_heads * hello.tp_size};
}

Status check_hello(const Hello& hello, const std::string& instance, const PoolGeometry& local,
                   const std::optional<HeadLayout>& heads) {
  if (hello.version != kWireVersion)
    return make_error(
        Errc::kVersionMismatch,
        fmt::format("wire protocol version {} here, {} at the peer", kWireVersion, hello.version));
  if (!hello.expected_instance.empty() && hello.expected_instance != instance)
    return make_error(Errc::kInvalidArgument, fmt::format("this is instance '{}', not '{}'",
                                                          instance, hello.expected_instance));
  if (!heads) return check_compatible(local, hello.pool);
  const HeadLayout theirs = sender_layout(hello);
  if (Status s = theirs.check(); !s)
    return make_error(Errc::kLayoutMismatch,
                      fmt::format("the peer's heads: {}", s.error().message));
  return check_compatible(local, *heads, hello.pool, theirs);
}

}  // namespace kvrelay::worker::net
