// libFuzzer target: what an rdma peer sends over the control connection. The
// first byte picks the message (even: RdmaQpInfo, odd: RdmaMemoryRegions,
// checked against the fuzz pool geometry); the rest is its capnp encoding,
// decoded as the worker decodes a peer's. Whatever decoding accepts must be
// usable as is: every address it gives for a range inside a tensor lies
// inside that tensor's region, and every range it accepts fits. A crash, a
// sanitizer report, a failed check or a hang is a finding.
//
// Seeds (corpus/rdma_endpoint): the byte 0 and
// `capnp encode schemas/kvrelay.capnp RdmaQpInfo` of
//   (lid = 0, qpn = 17, psn = 1234, gid = 0x"00000000000000000000ffffc0000201", mtu = 1024),
// the byte 1 and an RdmaMemoryRegions of the fuzz geometry (one region per
// tensor), and both with fields spoiled.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_geometry.h"
#include "schemas/codec.h"
#include "worker/rdma/endpoint_codec.h"

namespace {

using namespace kvrelay;
using namespace kvrelay::worker::rdma;

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const PoolGeometry g = fuzz::fuzz_geometry();
  std::vector<uint64_t> words((size - 1) / 8);
  if (!words.empty()) std::memcpy(words.data(), data + 1, words.size() * 8);
  const std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(words.data()),
                                           words.size() * 8);
  if (data[0] % 2 == 0) {
    (void)messages::with_message<schema::RdmaQpInfo>(
        payload, [&](schema::RdmaQpInfo::Reader in) -> Status {
          Result<QpEndpoint> e = decode_endpoint(in);
          if (e) check(e->qpn != 0 && e->qpn <= 0xffffff && e->mtu >= 256 && e->mtu <= 4096);
          return {};
        });
    return 0;
  }
  (void)messages::with_message<schema::RdmaMemoryRegions>(
      payload, [&](schema::RdmaMemoryRegions::Reader in) -> Status {
        Result<RemoteTensors> r = decode_regions(in, g);
        if (!r) return {};
        for (uint32_t l = 0; l < g.total_layers(); ++l) {
          for (uint32_t t = 0; t < g.tensors_per_layer(); ++t) {
            const uint64_t bytes = g.tensor_bytes(l, static_cast<PoolTensor>(t));
            Result<uint64_t> first = r->address(l, t, 0, bytes);
            Result<uint64_t> last = r->address(l, t, bytes - 1, 1);
            check(first.ok() && last.ok() && *last == *first + bytes - 1);
            check(!r->address(l, t, bytes, 1).ok());
          }
        }
        return {};
      });
  return 0;
}
