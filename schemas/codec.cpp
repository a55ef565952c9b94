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
    case schema::MessageType::NET_ENVELOPE: return "NetEnvelope";
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

}  // namespace kvrelay::messages
