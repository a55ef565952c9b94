// Messages through ring records: every message type written with the codec
// and read back in place; malformed records rejected with kCorrupt; and the
// reference `capnp decode` tool reading a record we wrote.
#include "schemas/codec.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <vector>

#include "schemas/message_builders.h"
#include "schemas/message_ring.h"
#include "support/processes.h"

namespace kvrelay::messages {
namespace {

using namespace std::chrono_literals;
using schema::MessageType;

class RingCodec : public ::testing::Test {
 protected:
  static constexpr uint64_t kCapacity = 1 << 16;
  kvrelay::testing::SharedRegion mem{MpscRing::bytes_for(kCapacity)};
  MpscRing ring = [&] {
    (void)MpscRing::initialize(mem.data(), mem.size(), kCapacity,
                               MpscRing::default_max_payload(kCapacity));
    return MpscRing::attach(mem.data(), mem.size()).value();
  }();
  MpscProducer producer = ring.lease_producer().value();

  void write(MessageType type, capnp::MessageBuilder& msg) {
    Status s = write_message(producer, type, msg, Deadline::after(1s));
    ASSERT_TRUE(s.ok()) << s.error().message;
  }
  // Reads exactly one record and runs `check` on it, in place.
  template <class T, class Check>
  void read_one(MessageType expect_type, Check check) {
    size_t seen = 0;
    ring.read([&](const MpscRecord& rec) {
      const std::span<const std::byte> payload = rec.payload;
      ++seen;
      EXPECT_EQ(rec.type, static_cast<int32_t>(expect_type));
      const auto* ring_bytes = static_cast<const std::byte*>(mem.data());
      EXPECT_GE(payload.data(), ring_bytes) << "decoded in place, not from a copy";
      EXPECT_LT(payload.data(), ring_bytes + mem.size());
      Status s = with_message<T>(payload, [&](typename T::Reader r) -> Status {
        check(r);
        return {};
      });
      EXPECT_TRUE(s.ok()) << s.error().message;
    });
    EXPECT_EQ(seen, 1u);
  }
};

TEST_F(RingCodec, CacheTaskRoundTrips) {
  capnp::MallocMessageBuilder msg;
  kvrelay::testing::fill_cache_task(msg.initRoot<schema::CacheTask>(), "req-1", {7, 8, 9}, 150, 42);
  msg.getRoot<schema::CacheTask>().setDeadlineMs(2500);
  write(MessageType::CACHE_TASK, msg);
  read_one<schema::CacheTask>(MessageType::CACHE_TASK, [](schema::CacheTask::Reader t) {
    EXPECT_EQ(std::string(t.getRequestId().cStr()), "req-1");
    ASSERT_EQ(t.getSrcBlockIds().size(), 3u);
    EXPECT_EQ(t.getSrcBlockIds()[2], 9u);
    EXPECT_EQ(t.getNeedPrefillTokens(), 150u);
    ASSERT_TRUE(t.isEngineSlot());
    EXPECT_EQ(t.getEngineSlot(), 42u);
    EXPECT_EQ(t.getDeadlineMs(), 2500u);
  });
}

TEST_F(RingCodec, LegacyCacheTaskRoundTrips) {
  capnp::MallocMessageBuilder msg;
  auto t = msg.initRoot<schema::CacheTask>();
  kvrelay::testing::fill_cache_task(t, "req-2", {1}, 10, 0);
  t.setLegacyPrefillStep(100004);
  write(MessageType::CACHE_TASK, msg);
  read_one<schema::CacheTask>(MessageType::CACHE_TASK, [](schema::CacheTask::Reader r) {
    ASSERT_TRUE(r.isLegacyPrefillStep());
    EXPECT_EQ(r.getLegacyPrefillStep(), 100004u);
  });
}

TEST_F(RingCodec, CacheDestRoundTrips) {
  capnp::MallocMessageBuilder msg;
  auto d = msg.initRoot<schema::CacheDest>();
  d.setRequestId("req-1");
  kvrelay::testing::set_list(d.initDestBlockIds(2), {30, 31});
  d.setProtocol(schema::TransferProtocol::RDMA);
  d.setPeerAddress("198.18.2.3");
  auto ports = d.initRdmaPorts(2);
  ports.set(0, 8100);
  ports.set(1, 8101);
  kvrelay::testing::set_list(d.initDeviceIds(2), {4, 5});
  write(MessageType::CACHE_DEST, msg);
  read_one<schema::CacheDest>(MessageType::CACHE_DEST, [](schema::CacheDest::Reader r) {
    EXPECT_EQ(r.getProtocol(), schema::TransferProtocol::RDMA);
    EXPECT_EQ(std::string(r.getPeerAddress().cStr()), "198.18.2.3");
    EXPECT_EQ(r.getRdmaPorts()[1], 8101);
    EXPECT_EQ(r.getDeviceIds()[0], 4u);
    EXPECT_EQ(r.getDestBlockIds()[1], 31u);
  });
}

TEST_F(RingCodec, SwapTaskRoundTrips) {
  capnp::MallocMessageBuilder msg;
  auto s = msg.initRoot<schema::SwapTask>();
  s.setRequestId("swap-9");
  s.setDirection(schema::SwapTask::Direction::LOAD);
  kvrelay::testing::set_list(s.initDeviceBlockIds(2), {1, 2});
  kvrelay::testing::set_list(s.initHostBlockIds(2), {10, 20});
  s.setFirstLayer(3);
  s.setLayerCount(5);
  write(MessageType::SWAP_TASK, msg);
  read_one<schema::SwapTask>(MessageType::SWAP_TASK, [](schema::SwapTask::Reader r) {
    EXPECT_EQ(r.getDirection(), schema::SwapTask::Direction::LOAD);
    EXPECT_EQ(r.getHostBlockIds()[1], 20u);
    EXPECT_EQ(r.getFirstLayer(), 3u);
    EXPECT_EQ(r.getLayerCount(), 5u);
  });
}

TEST_F(RingCodec, ConnectCancelAndRegisterPoolRoundTrip) {
  {
    capnp::MallocMessageBuilder msg;
    auto c = msg.initRoot<schema::ConnectTask>();
    c.setTaskId(77);
    c.setProtocol(schema::TransferProtocol::TCP);
    c.setPeerAddress("host-b");
    c.initPorts(2).set(1, 9001);
    write(MessageType::CONNECT_TASK, msg);
    read_one<schema::ConnectTask>(MessageType::CONNECT_TASK, [](schema::ConnectTask::Reader r) {
      EXPECT_EQ(r.getTaskId(), 77u);
      EXPECT_EQ(r.getPorts()[1], 9001);
    });
  }
  {
    capnp::MallocMessageBuilder msg;
    msg.initRoot<schema::Cancel>().setRequestId("req-5");
    write(MessageType::CANCEL, msg);
    read_one<schema::Cancel>(MessageType::CANCEL, [](schema::Cancel::Reader r) {
      EXPECT_EQ(std::string(r.getRequestId().cStr()), "req-5");
    });
  }
  {
    capnp::MallocMessageBuilder msg;
    auto p = msg.initRoot<schema::RegisterPool>().initPool();
    p.setRank(1);
    p.setLocation(schema::PoolDescriptor::Location::CUDA_IPC);
    auto memories = p.initMemories(2);
    std::array<kj::byte, 64> h{};
    h[63] = 0xAB;
    memories[0].setIpcHandle(kj::arrayPtr(h.data(), h.size()));
    memories[1].setIpcHandle(kj::arrayPtr(h.data(), h.size()));
    memories[1].setBytes(1 << 20);
    auto tensors = p.initTensors(2);
    tensors[1].setMemory(1);
    tensors[1].setOffset(4096);
    p.setDtype(schema::CacheDtype::FP8);
    p.setHasScales(true);
    write(MessageType::REGISTER_POOL, msg);
    read_one<schema::RegisterPool>(MessageType::REGISTER_POOL, [](schema::RegisterPool::Reader r) {
      EXPECT_EQ(r.getPool().getRank(), 1u);
      EXPECT_EQ(r.getPool().getMemories()[1].getIpcHandle()[63], 0xAB);
      EXPECT_EQ(r.getPool().getMemories()[1].getBytes(), 1U << 20);
      EXPECT_EQ(r.getPool().getTensors()[1].getMemory(), 1U);
      EXPECT_EQ(r.getPool().getTensors()[1].getOffset(), 4096U);
      EXPECT_EQ(r.getPool().getDtype(), schema::CacheDtype::FP8);
      EXPECT_TRUE(r.getPool().getHasScales());
      EXPECT_TRUE(r.getPool().getHasValues()) << "default true";
    });
  }
}

TEST_F(RingCodec, WorkerTaskAndCompletionRoundTrip) {
  {
    capnp::MallocMessageBuilder msg;
    auto w = msg.initRoot<schema::WorkerTask>();
    w.setHandle(0x1234'5678'9abcULL);
    w.setRequestId("req-3");
    kvrelay::testing::fill_cache_task(w.initBind(), "req-3", {1, 2}, 100, 7);
    write(MessageType::WORKER_TASK, msg);
    read_one<schema::WorkerTask>(MessageType::WORKER_TASK, [](schema::WorkerTask::Reader r) {
      EXPECT_EQ(r.getHandle(), 0x1234'5678'9abcULL);
      ASSERT_TRUE(r.isBind());
      EXPECT_EQ(r.getBind().getEngineSlot(), 7u);
    });
  }
  {
    capnp::MallocMessageBuilder msg;
    auto w = msg.initRoot<schema::WorkerTask>();
    w.setHandle(9);
    kvrelay::testing::fill_cache_dest_ipc(w.initDest(), "req-3", {5});
    write(MessageType::WORKER_TASK, msg);
    read_one<schema::WorkerTask>(MessageType::WORKER_TASK, [](schema::WorkerTask::Reader r) {
      ASSERT_TRUE(r.isDest());
      EXPECT_EQ(r.getDest().getDestBlockIds()[0], 5u);
    });
  }
  {
    capnp::MallocMessageBuilder msg;
    auto c = msg.initRoot<schema::Completion>();
    c.setRequestId("req-3");
    c.setKind(schema::Completion::Kind::CACHE);
    c.setStatus(schema::Completion::Status::ERROR);
    c.setErrorRank(1);
    c.setMessage("rank 1: block id 812 out of range");
    c.setBytesMoved(1 << 20);
    write(MessageType::COMPLETION, msg);
    read_one<schema::Completion>(MessageType::COMPLETION, [](schema::Completion::Reader r) {
      EXPECT_EQ(r.getStatus(), schema::Completion::Status::ERROR);
      EXPECT_EQ(r.getErrorRank(), 1);
      EXPECT_EQ(std::string(r.getMessage().cStr()), "rank 1: block id 812 out of range");
      EXPECT_EQ(r.getBytesMoved(), 1u << 20);
    });
  }
}

TEST_F(RingCodec, TransportHandshakesRoundTrip) {
  {
    capnp::MallocMessageBuilder msg;
    auto h = msg.initRoot<schema::TransportHello>();
    h.setProtocolVersion(1);
    h.setInstance("prefill0");
    h.setRank(1);
    h.setTpSize(2);
    h.initPool().setNumBlocks(512);
    write(MessageType::TRANSPORT_HELLO, msg);
    read_one<schema::TransportHello>(MessageType::TRANSPORT_HELLO,
                                     [](schema::TransportHello::Reader r) {
                                       EXPECT_EQ(r.getTpSize(), 2u);
                                       EXPECT_EQ(r.getPool().getNumBlocks(), 512u);
                                     });
  }
  {
    capnp::MallocMessageBuilder msg;
    auto a = msg.initRoot<schema::TransportHelloAck>();
    a.setAccepted(false);
    a.setReason("block size differs");
    write(MessageType::TRANSPORT_HELLO_ACK, msg);
    read_one<schema::TransportHelloAck>(
        MessageType::TRANSPORT_HELLO_ACK, [](schema::TransportHelloAck::Reader r) {
          EXPECT_FALSE(r.getAccepted());
          EXPECT_EQ(std::string(r.getReason().cStr()), "block size differs");
        });
  }
  {
    capnp::MallocMessageBuilder msg;
    auto q = msg.initRoot<schema::RdmaQpInfo>();
    q.setLid(3);
    q.setQpn(0x123456);
    q.setPsn(99);
    std::array<kj::byte, 16> gid{};
    gid[0] = 0xfe;
    q.setGid(kj::arrayPtr(gid.data(), gid.size()));
    q.setMtu(4096);
    write(MessageType::RDMA_QP_INFO, msg);
    read_one<schema::RdmaQpInfo>(MessageType::RDMA_QP_INFO, [](schema::RdmaQpInfo::Reader r) {
      EXPECT_EQ(r.getQpn(), 0x123456u);
      EXPECT_EQ(r.getGid()[0], 0xfe);
      EXPECT_EQ(r.getMtu(), 4096u);
    });
  }
  {
    capnp::MallocMessageBuilder msg;
    auto regions = msg.initRoot<schema::RdmaMemoryRegions>().initRegions(2);
    regions[1].setLayer(31);
    regions[1].setTensor(1);
    regions[1].setAddress(0x7f00'0000'0000ULL);
    regions[1].setRkey(0xbeef);
    regions[1].setBytes(1 << 26);
    write(MessageType::RDMA_MEMORY_REGIONS, msg);
    read_one<schema::RdmaMemoryRegions>(MessageType::RDMA_MEMORY_REGIONS,
                                        [](schema::RdmaMemoryRegions::Reader r) {
                                          EXPECT_EQ(r.getRegions()[1].getRkey(), 0xbeefu);
                                          EXPECT_EQ(r.getRegions()[1].getBytes(), 1u << 26);
                                        });
  }
  {
    capnp::MallocMessageBuilder msg;
    auto f = msg.initRoot<schema::TcpFrameHeader>();
    f.setHandle(5);
    f.setLayer(2);
    f.setDstOffset(4096);
    f.setBytes(65536);
    f.setLast(true);
    write(MessageType::TCP_FRAME_HEADER, msg);
    read_one<schema::TcpFrameHeader>(MessageType::TCP_FRAME_HEADER,
                                     [](schema::TcpFrameHeader::Reader r) {
                                       EXPECT_EQ(r.getDstOffset(), 4096u);
                                       EXPECT_TRUE(r.getLast());
                                     });
  }
}

TEST_F(RingCodec, MessageLargerThanTheRecordLimitIsRefusedAndNothingIsWritten) {
  capnp::MallocMessageBuilder msg;
  auto t = msg.initRoot<schema::CacheTask>();
  t.setRequestId("big");
  t.initSrcBlockIds(static_cast<unsigned>(ring.max_payload_bytes() / 4 + 10));
  Status s = write_message(producer, MessageType::CACHE_TASK, msg, Deadline::after(1s));
  ASSERT_EQ(s.code(), Errc::kTooLarge);
  EXPECT_NE(s.error().message.find("exceeds the ring's record limit of " +
                                   std::to_string(ring.max_payload_bytes()) + " bytes"),
            std::string::npos);
  EXPECT_EQ(ring.used_bytes(), 0u);
}

// ---- malformed input ----

std::vector<capnp::word> aligned(std::span<const std::byte> bytes) {
  std::vector<capnp::word> words((bytes.size() + 7) / 8);
  if (!bytes.empty()) std::memcpy(words.data(), bytes.data(), bytes.size());
  return words;
}

std::vector<std::byte> encode(capnp::MessageBuilder& msg) {
  std::vector<std::byte> out(encoded_bytes(msg));
  encode_into(msg, out);
  return out;
}

Status decode_task(std::span<const std::byte> bytes, const ReadLimits& limits = {}) {
  auto words = aligned(bytes);
  return with_message<schema::CacheTask>(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(words.data()), bytes.size()),
      [](schema::CacheTask::Reader t) -> Status {
        // Touch everything, as a validator would.
        (void)t.getRequestId();
        for (uint32_t id : t.getSrcBlockIds())
          (void)id;
        return {};
      },
      limits);
}

TEST(MalformedRecords, TruncatedMessageIsCorruptNotACrash) {
  capnp::MallocMessageBuilder msg;
  kvrelay::testing::fill_cache_task(msg.initRoot<schema::CacheTask>(), "req-1", {1, 2, 3}, 100, 1);
  auto bytes = encode(msg);
  Status s = decode_task(std::span<const std::byte>(bytes).first(bytes.size() - 16));
  ASSERT_EQ(s.code(), Errc::kCorrupt);
  EXPECT_NE(s.error().message.find("malformed CacheTask"), std::string::npos);
}

TEST(MalformedRecords, SegmentTableClaimingHugeSegmentsIsCorrupt) {
  std::vector<std::byte> bytes(16);
  const uint32_t header[2] = {0, 0x7fffffff};  // one segment of 2^31 words
  std::memcpy(bytes.data(), header, sizeof(header));
  EXPECT_EQ(decode_task(bytes).code(), Errc::kCorrupt);
}

TEST(MalformedRecords, TraversalLimitStopsAnAmplifiedRead) {
  capnp::MallocMessageBuilder msg;
  auto t = msg.initRoot<schema::CacheTask>();
  t.setRequestId("r");
  t.initSrcBlockIds(10'000);
  auto bytes = encode(msg);
  EXPECT_TRUE(decode_task(bytes).ok());
  Status s = decode_task(bytes, ReadLimits{.traversal_words = 100, .nesting = 16});
  ASSERT_EQ(s.code(), Errc::kCorrupt);
  EXPECT_NE(s.error().message.find("traversal limit"), std::string::npos) << s.error().message;
}

TEST(MalformedRecords, NestingLimitIsEnforced) {
  capnp::MallocMessageBuilder msg;
  auto w = msg.initRoot<schema::WorkerTask>();
  kvrelay::testing::fill_cache_task(w.initBind(), "r", {1}, 1, 0);
  auto bytes = encode(msg);
  auto words = aligned(bytes);
  Status s = with_message<schema::WorkerTask>(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(words.data()), bytes.size()),
      [](schema::WorkerTask::Reader r) -> Status {
        (void)r.getBind().getSrcBlockIds()[0];
        return {};
      },
      ReadLimits{.traversal_words = 1 << 20, .nesting = 1});
  ASSERT_EQ(s.code(), Errc::kCorrupt);
  EXPECT_NE(s.error().message.find("too deeply-nested"), std::string::npos) << s.error().message;
}

TEST(MalformedRecords, UnalignedOrEmptyPayloadIsRefused) {
  std::vector<std::byte> bytes(24);
  EXPECT_EQ(decode_task(std::span<const std::byte>(bytes).first(0)).code(), Errc::kCorrupt);
  EXPECT_EQ(with_message<schema::CacheTask>(std::span<const std::byte>(bytes).subspan(1, 8),
                                            [](schema::CacheTask::Reader) -> Status { return {}; })
                .code(),
            Errc::kCorrupt);
}

TEST(MalformedRecords, RandomBytesNeverCrashTheDecoder) {
  uint64_t state = 0x9E3779B97F4A7C15ULL;
  for (int i = 0; i < 5000; ++i) {
    std::vector<std::byte> bytes(8 * (1 + i % 40));
    for (auto& b : bytes) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      b = std::byte(state & 0xff);
    }
    (void)decode_task(bytes);  // ok or kCorrupt; ASan/UBSan catch anything worse
  }
  SUCCEED();
}

// The reference tool decodes a record exactly as we wrote it: our framing is
// standard capnp, not something of our own.
TEST_F(RingCodec, ReferenceCapnpDecodeToolReadsARecordWeWrote) {
  capnp::MallocMessageBuilder msg;
  kvrelay::testing::fill_cache_task(msg.initRoot<schema::CacheTask>(), "req-42", {3, 1, 4}, 150, 9);
  write(MessageType::CACHE_TASK, msg);
  const std::string path =
      ::testing::TempDir() + "kvrelay-record-" + std::to_string(getpid()) + ".bin";
  ring.read([&](const MpscRecord& rec) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(rec.payload.data()),
               static_cast<std::streamsize>(rec.payload.size()));
  });
  const std::string cmd =
      std::string("capnp decode --short ") + KVRELAY_SCHEMA_FILE + " CacheTask < " + path + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof(buf), pipe) != nullptr)
    out += buf;
  EXPECT_EQ(pclose(pipe), 0) << out;
  std::remove(path.c_str());
  EXPECT_EQ(out,
            "(requestId = \"req-42\", srcBlockIds = [3, 1, 4], needPrefillTokens = 150, "
            "engineSlot = 9, deadlineMs = 0, clientSubmitNs = 0)\n");
}

}  // namespace
}  // namespace kvrelay::messages
