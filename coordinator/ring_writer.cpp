#include "coordinator/ring_writer.h"

#include <capnp/serialize.h>
#include <spdlog/spdlog.h>

#include "schemas/codec.h"
#include "schemas/message_ring.h"

namespace kvrelay::coordinator {

void RingWriter::write(schema::MessageType type, capnp::MessageBuilder& message) {
  if (backlog_.empty()) {
    Status s = messages::write_message(producer_, type, message, Deadline::now());
    if (s.ok()) {
      if (doorbell_ != nullptr) notify_waiters(*doorbell_);
      return;
    }
    if (s.code() == Errc::kTooLarge || s.code() == Errc::kInvalidArgument) {
      // The caller sizes what it writes to fit; this is a bug, and loud.
      spdlog::critical("cannot write a {}: {}", messages::message_type_name(type),
                       s.error().message);
      return;
    }
  }
  ++delayed_;
  backlog_.emplace_back(static_cast<int32_t>(type), capnp::messageToFlatArray(message));
}

bool RingWriter::flush() {
  bool wrote = false;
  while (!backlog_.empty()) {
    auto& [type, words] = backlog_.front();
    const auto bytes = words.asBytes();
    Status s = producer_.try_write(
        type, std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.begin()),
                                         bytes.size()));
    if (!s) break;
    backlog_.pop_front();
    wrote = true;
  }
  if (wrote && doorbell_ != nullptr) notify_waiters(*doorbell_);
  return backlog_.empty();
}

}  // namespace kvrelay::coordinator
