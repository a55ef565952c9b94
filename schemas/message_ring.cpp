#include "schemas/message_ring.h"

#include <fmt/format.h>
#include <kj/exception.h>

#include <string>

namespace kvrelay::messages {

Status write_message(MpscProducer& producer, schema::MessageType type,
                     capnp::MessageBuilder& message, Deadline deadline) {
  const size_t bytes = encoded_bytes(message);
  const uint32_t limit = producer.max_payload_bytes();
  if (bytes > limit) {
    return make_error(Errc::kTooLarge,
                      fmt::format("{} of {} bytes exceeds the ring's record limit of {} bytes",
                                  message_type_name(type), bytes, limit));
  }
  std::string failure;
  Status s = producer.write_with(
      static_cast<int32_t>(type), bytes,
      [&](std::span<std::byte> out) {
        try {
          encode_into(message, out);
          return true;
        } catch (const kj::Exception& e) {
          failure = e.getDescription().cStr();
          return false;
        }
      },
      deadline);
  if (!failure.empty())
    return make_error(Errc::kInvalidArgument,
                      fmt::format("could not serialize {}: {}", message_type_name(type), failure));
  return s;
}

}  // namespace kvrelay::messages
