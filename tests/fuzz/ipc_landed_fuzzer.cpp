// libFuzzer target: a decode worker's landed ring record (IpcLanded), as a
// prefill worker on the same host, or anything that scribbles on the ring,
// could write it. Each input is one record's payload, replayed exactly as the
// decode worker does (replay_landed) into an Arrivals that expects a few
// requests, so that every rule a record can touch runs: layers and blocks
// out of range, refused and landed writes of declared, undeclared and
// finished requests. Anything may come back; a crash, a sanitizer report, a
// hang or a leak is a finding.
//
// Seeds (corpus/ipc_landed) are `capnp encode schemas/kvrelay.capnp IpcLanded`
// of records such as
//   (requestKey = 4953267810257967366, layer = 0, firstBlocks = [0, 4],
//    blockCounts = [4, 4], refused = false)
// (4953267810257967366 is request_key("a")).
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_geometry.h"
#include "worker/ipc/ipc_receiver.h"

namespace {

using namespace kvrelay;
using namespace kvrelay::worker;
using fuzz::fuzz_geometry;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const PoolGeometry g = fuzz_geometry();
  Arrivals arrivals(g, nullptr);
  // Keys the seeds use: "a" holds blocks 0..7, "b" 8..9, "c" arrived already.
  (void)arrivals.expect(1, "a", {0, 1, 2, 3, 4, 5, 6, 7});
  (void)arrivals.expect(2, "b", {8, 9});
  (void)arrivals.expect(3, "c", {});
  std::vector<uint64_t> words(size / 8);
  if (!words.empty()) std::memcpy(words.data(), data, words.size() * 8);
  (void)replay_landed(std::span<const std::byte>(reinterpret_cast<const std::byte*>(words.data()),
                                                 words.size() * 8),
                      g, arrivals);
  (void)arrivals.take();
  return 0;
}
