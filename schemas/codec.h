// Cap'n Proto messages in ring records.
//
// Writing: a message is built with any capnp MessageBuilder, then serialized
// straight into a claimed ring record (standard, unpacked capnp framing: the
// segment table, then the segments), and the record is committed with the
// MessageType as its record type.
//
// Reading: the record's payload is read in place, without a copy, through a
// FlatArrayMessageReader with a traversal limit and a nesting limit: the
// bytes were written by another process, and capnp checks every pointer
// against these limits and the buffer's bounds as it is followed. Malformed
// input surfaces as a kj::Exception, which with_message() turns into an
// Error (kCorrupt) naming the message type and capnp's description.
//
// Both directions are plain functions of (bytes, limits); the rings know
// nothing of capnp and capnp knows nothing of rings (message_ring.h writes
// messages as ring records).
#pragma once

#include <capnp/message.h>
#include <capnp/schema.h>
#include <capnp/serialize.h>
#include <fmt/format.h>
#include <kj/exception.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "schemas/kvrelay.capnp.h"
#include "shm/clock.h"
#include "shm/result.h"

namespace kvrelay::messages {

struct ReadLimits {
  // Words (8 bytes) the reader may traverse: bounds the work an adversarial
  // message (e.g. one pointing many times at the same list) can cause.
  uint64_t traversal_words = 1 << 20;
  int nesting = 16;
};

const char* message_type_name(schema::MessageType type);

// An owned copy of a list of ids read in place (block ids, ports).
inline std::vector<uint32_t> to_vector(capnp::List<uint32_t>::Reader list) {
  std::vector<uint32_t> out;
  out.reserve(list.size());
  for (uint32_t v : list)
    out.push_back(v);
  return out;
}

// Bytes the serialized message occupies (a multiple of 8).
size_t encoded_bytes(capnp::MessageBuilder& message);
// Serializes into `out`, whose size must be encoded_bytes(message).
void encode_into(capnp::MessageBuilder& message, std::span<std::byte> out);

// Decodes `payload` in place as a T and hands its reader to `fn`, which
// returns a Status (or Result). Any capnp error - a bad segment table, a
// pointer out of bounds, a limit exceeded - while decoding or inside `fn` is
// returned as kCorrupt. `payload` must be 8-byte aligned (ring records are).
template <class T, class Fn>
auto with_message(std::span<const std::byte> payload, Fn&& fn, const ReadLimits& limits = {})
    -> decltype(fn(std::declval<typename T::Reader>())) {
  using Ret = decltype(fn(std::declval<typename T::Reader>()));
  const char* what = capnp::Schema::from<T>().getShortDisplayName().cStr();
  if (payload.empty() || payload.size() % 8 != 0 ||
      reinterpret_cast<uintptr_t>(payload.data()) % 8 != 0) {
    return Ret(make_error(Errc::kCorrupt,
                          fmt::format("malformed {}: {} bytes is not a whole number of aligned "
                                      "8-byte words",
                                      what, payload.size())));
  }
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = limits.traversal_words;
    options.nestingLimit = limits.nesting;
    capnp::FlatArrayMessageReader reader(
        kj::ArrayPtr<const capnp::word>(reinterpret_cast<const capnp::word*>(payload.data()),
                                        payload.size() / 8),
        options);
    return fn(reader.getRoot<T>());
  } catch (const kj::Exception& e) {
    return Ret(make_error(Errc::kCorrupt,
                          fmt::format("malformed {}: {}", what, e.getDescription().cStr())));
  }
}

}  // namespace kvrelay::messages
