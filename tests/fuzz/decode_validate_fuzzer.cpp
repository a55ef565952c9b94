// libFuzzer target: decode-then-validate, exactly what the coordinator does
// with a record taken from the submit ring.
//
// Input: byte 0 selects the message type (MessageType ordinal, modulo the
// types a client may submit), the rest is the record payload. The payload is
// copied into an 8-byte-aligned buffer, as ring records are aligned.
// Anything may come back (ok, kInvalidArgument, kCorrupt); a crash, a
// sanitizer report, a hang or a leak is a finding.
#include <cstdint>
#include <cstring>
#include <vector>

#include "schemas/codec.h"
#include "schemas/validate.h"

namespace {

using namespace kvrelay;
using namespace kvrelay::messages;

Limits fuzz_limits() {
  Limits l;
  l.tp_size = 2;
  l.pool.num_layers = 32;
  l.pool.extra_layers = 1;
  l.pool.extra_layer_blocks = 64;
  l.pool.num_blocks = 512;
  l.host_blocks = 1024;
  l.pool.block_size = 64;
  l.pool.kv_heads = 1;
  l.pool.head_dim = 128;
  return l;
}

template <class T>
void decode_and_validate(std::span<const std::byte> payload, const Limits& limits) {
  (void)with_message<T>(payload,
                        [&](typename T::Reader r) -> Status { return validate(r, limits); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t selector = data[0];
  std::vector<uint64_t> words((size - 1 + 7) / 8);
  if (size > 1) std::memcpy(words.data(), data + 1, size - 1);
  const std::span<const std::byte> payload(reinterpret_cast<const std::byte*>(words.data()),
                                           words.size() * 8);
  static const Limits limits = fuzz_limits();
  switch (selector % 7) {
    case 0: decode_and_validate<schema::CacheTask>(payload, limits); break;
    case 1:
      (void)with_message<schema::CacheDest>(
          payload, [&](schema::CacheDest::Reader r) -> Status { return validate(r, limits, 256); });
      break;
    case 2: decode_and_validate<schema::SwapTask>(payload, limits); break;
    case 3: decode_and_validate<schema::ConnectTask>(payload, limits); break;
    case 4: decode_and_validate<schema::Cancel>(payload, limits); break;
    case 5: decode_and_validate<schema::RegisterPool>(payload, limits); break;
    case 6:
      // A merged pair, as the coordinator validates it once both halves are in.
      (void)with_message<schema::SendTask>(payload, [&](schema::SendTask::Reader r) -> Status {
        if (Status s = validate(r.getTask(), limits); !s) return s;
        if (Status s = validate(r.getDest(), limits, 256); !s) return s;
        return validate_pair(r.getTask(), r.getDest());
      });
      break;
  }
  return 0;
}
