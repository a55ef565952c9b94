#include "schemas/codec.h"

#include <capnp/schema.h>
#include <kj/io.h>

namespace kvrelay::messages {

const char* message_type_name(schema::MessageType type) {
  switch (type) {
    case schema::MessageType::INVALID: return "invalid";
    case schema::MessageType::CACHE_TASK: return "CacheTask";
    case schema::MessageType::CACHE_DEST: return "CacheDest";
    case schema::MessageType::SWAP_TASK: return "SwapTask";
    case schema::MessageType::CONNECT_TASK: return "ConnectTask";
    case schema::MessageType::CANCEL: return "Cancel";
    case schema::MessageType::REGISTER_POOL: return "RegisterPool";
    case schema::MessageType::WORKER_TASK: return "WorkerTask";
    case schema::MessageType::COMPLETION: return "Completion";
    case schema::MessageType::TRANSPORT_HELLO: return "TransportHello";
    case schema::MessageType::TRANSPORT_HELLO_ACK: return "TransportHelloAck";
    case schema::MessageType::RDMA_QP_INFO: return "RdmaQpInfo";
    case schema::MessageType::RDMA_MEMORY_REGIONS: return "RdmaMemoryRegions";
    case schema::MessageType::TCP_FRAME_HEADER: return "TcpFrameHeader";
    case schema::MessageType::SESSION_HELLO: return "SessionHello";
    case schema::MessageType::TCP_ENVELOPE: return "TcpEnvelope";
    case schema::MessageType::EXPECT_ARRIVAL: return "ExpectArrival";
    case schema::MessageType::IPC_LANDED: return "IpcLanded";
  }
  return "unknown";
}

size_t encoded_bytes(capnp::MessageBuilder& message) {
  return capnp::computeSerializedSizeInWords(message) * sizeof(capnp::word);
}

void encode_into(capnp::MessageBuilder& message, std::span<std::byte> out) {
  kj::ArrayOutputStream stream(
      kj::ArrayPtr<kj::byte>(reinterpret_cast<kj::byte*>(out.data()), out.size()));
  capnp::writeMessage(stream, message);
}

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
