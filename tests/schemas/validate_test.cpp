// Every validation rule, each broken by one message, with the error text it
// must produce.
#include "schemas/validate.h"

#include <gtest/gtest.h>

#include <array>
#include <memory>

#include "schemas/message_builders.h"

namespace kvrelay::messages {
namespace {

using testing::example_limits;
using testing::fill_cache_dest_ipc;
using testing::fill_cache_task;

std::string error_of(const Status& s) {
  return s.ok() ? "ok" : s.error().message;
}

class CacheTaskRules : public ::testing::Test {
 protected:
  // Held by pointer: MallocMessageBuilder's destructor is noexcept(false).
  std::unique_ptr<capnp::MallocMessageBuilder> owner =
      std::make_unique<capnp::MallocMessageBuilder>();
  capnp::MallocMessageBuilder& msg = *owner;
  schema::CacheTask::Builder task = msg.initRoot<schema::CacheTask>();
  void SetUp() override { fill_cache_task(task, "req-17", {4, 5, 6}, 150, 3); }
  std::string check() { return error_of(validate(task.asReader(), example_limits())); }
};

TEST_F(CacheTaskRules, AValidTaskPasses) {
  EXPECT_EQ(check(), "ok");
}

TEST_F(CacheTaskRules, SourceBlockIdOutOfRange) {
  task.getSrcBlockIds().set(1, 812);
  EXPECT_EQ(check(),
            "CacheTask 'req-17': src_block_ids[1] = 812 is out of range: the pool has 512 blocks");
}

TEST_F(CacheTaskRules, MoreSourceBlocksThanThePoolHas) {
  auto list = task.initSrcBlockIds(600);
  for (unsigned i = 0; i < 600; ++i)
    list.set(i, i % 512);
  EXPECT_EQ(check(),
            "CacheTask 'req-17': src_block_ids has 600 entries; the pool has only 512 blocks");
}

TEST_F(CacheTaskRules, EmptySourceList) {
  task.initSrcBlockIds(0);
  EXPECT_EQ(check(), "CacheTask 'req-17': src_block_ids is empty");
}

TEST_F(CacheTaskRules, TokensNeedMoreBlocksThanListed) {
  task.setNeedPrefillTokens(300);
  EXPECT_EQ(check(),
            "CacheTask 'req-17': need_prefill_tokens 300 needs 5 blocks of 64 tokens but "
            "src_block_ids has 3 entries");
}

TEST_F(CacheTaskRules, ZeroTokens) {
  task.setNeedPrefillTokens(0);
  EXPECT_EQ(check(), "CacheTask 'req-17': need_prefill_tokens is 0");
}

TEST_F(CacheTaskRules, EngineSlotOutOfRange) {
  task.setEngineSlot(512);
  EXPECT_EQ(check(), "CacheTask 'req-17': engine_slot 512 is out of range: slots are 0..511");
}

TEST_F(CacheTaskRules, LegacyStepNeedsNoSlot) {
  task.setLegacyPrefillStep(123456789012ULL);
  EXPECT_EQ(check(), "ok");
}

TEST_F(CacheTaskRules, EmptyRequestId) {
  task.setRequestId("");
  EXPECT_EQ(check(), "CacheTask: request_id is empty");
}

TEST_F(CacheTaskRules, OverlongRequestId) {
  task.setRequestId(std::string(129, 'a'));
  EXPECT_EQ(check(), "CacheTask: request_id is 129 bytes; at most 128 are allowed");
}

TEST_F(CacheTaskRules, RequestIdWithNonAsciiByte) {
  task.setRequestId(std::string("req\xff-1"));
  EXPECT_EQ(check(),
            "CacheTask: request_id has byte 0xff at position 3; request ids are printable ASCII "
            "without spaces");
}

TEST_F(CacheTaskRules, RequestIdWithASpace) {
  task.setRequestId("req 1");
  EXPECT_EQ(check(),
            "CacheTask: request_id has byte 0x20 at position 3; request ids are printable ASCII "
            "without spaces");
}

class CacheDestRules : public ::testing::Test {
 protected:
  std::unique_ptr<capnp::MallocMessageBuilder> owner =
      std::make_unique<capnp::MallocMessageBuilder>();
  capnp::MallocMessageBuilder& msg = *owner;
  schema::CacheDest::Builder dest = msg.initRoot<schema::CacheDest>();
  void SetUp() override { fill_cache_dest_ipc(dest, "req-17", {10, 11, 12}); }
  std::string check(std::optional<uint32_t> peer_blocks = 256) {
    return error_of(validate(dest.asReader(), example_limits(), peer_blocks));
  }
};

TEST_F(CacheDestRules, AValidDestinationPasses) {
  EXPECT_EQ(check(), "ok");
}

TEST_F(CacheDestRules, DestinationBlockIdOutOfRangeOfThePeerPool) {
  dest.getDestBlockIds().set(2, 300);
  EXPECT_EQ(check(),
            "CacheDest 'req-17': dest_block_ids[2] = 300 is out of range: the decode pool has 256 "
            "blocks");
}

TEST_F(CacheDestRules, DuplicateDestinationIds) {
  auto list = dest.initDestBlockIds(6);
  testing::set_list(list, {1, 2, 17, 3, 4, 17});
  EXPECT_EQ(check(), "CacheDest 'req-17': dest_block_ids has block 17 twice (at 2 and 5)");
}

TEST_F(CacheDestRules, UnknownProtocol) {
  dest.setProtocol(static_cast<schema::TransferProtocol>(7));
  EXPECT_EQ(check(), "CacheDest 'req-17': protocol 7 is unknown (expected ipc, tcp or rdma)");
}

TEST_F(CacheDestRules, DeviceIdMissingForARank) {
  dest.initDeviceIds(1);
  EXPECT_EQ(check(),
            "CacheDest 'req-17': device_ids has 1 entry but the instance has 2 ranks (one device "
            "id per rank)");
}

TEST_F(CacheDestRules, RdmaPortsNameEveryDecodeRank) {
  dest.setProtocol(schema::TransferProtocol::RDMA);
  dest.setPeerAddress("198.18.0.2");
  dest.initRdmaPorts(1).set(0, 9000);  // a decode instance of tp 1: heterogeneous TP
  EXPECT_EQ(check(), "ok");
  dest.initRdmaPorts(0);
  EXPECT_EQ(check(),
            "CacheDest 'req-17': rdma_ports has 0 entries; it needs one port per decode rank, 1 to "
            "16");
  dest.initRdmaPorts(17);
  EXPECT_EQ(check(),
            "CacheDest 'req-17': rdma_ports has 17 entries; it needs one port per decode rank, 1 "
            "to 16");
}

TEST_F(CacheDestRules, ZeroTcpPort) {
  dest.setProtocol(schema::TransferProtocol::TCP);
  dest.setPeerAddress("decode-host");
  auto ports = dest.initTcpPorts(2);
  ports.set(0, 9000);
  ports.set(1, 0);
  EXPECT_EQ(check(), "CacheDest 'req-17': tcp_ports[1] = 0 is not a port");
}

TEST_F(CacheDestRules, NetworkProtocolNeedsAnAddress) {
  dest.setProtocol(schema::TransferProtocol::RDMA);
  EXPECT_EQ(check(), "CacheDest 'req-17': protocol rdma needs peer_address");
}

TEST_F(CacheDestRules, IpcNeedsAValidPeerInstance) {
  dest.setPeerInstance("../etc");
  EXPECT_EQ(check(),
            "CacheDest 'req-17': peer_instance: instance name has '/' at position 2; only "
            "[A-Za-z0-9._-] are allowed");
}

TEST_F(CacheDestRules, ErrorHalfNeedsNoBlocks) {
  dest.setErrorMessage("decode out of blocks");
  dest.setProtocol(static_cast<schema::TransferProtocol>(9));
  EXPECT_EQ(check(), "ok");
}

TEST(CachePairRules, DestinationLongerThanSource) {
  capnp::MallocMessageBuilder a, b;
  auto task = a.initRoot<schema::CacheTask>();
  std::vector<uint32_t> src(32), dst(40);
  for (uint32_t i = 0; i < 32; ++i)
    src[i] = i;
  for (uint32_t i = 0; i < 40; ++i)
    dst[i] = 100 + i;
  fill_cache_task(task, "req-17", src, 32 * 64, 0);
  auto dest = b.initRoot<schema::CacheDest>();
  fill_cache_dest_ipc(dest, "req-17", dst);
  EXPECT_EQ(error_of(validate_pair(task.asReader(), dest.asReader())),
            "CacheDest 'req-17': dest_block_ids has 40 entries but src_block_ids has 32");
}

TEST(CachePairRules, ShorterDestinationIsAPrefixHit) {
  capnp::MallocMessageBuilder a, b;
  auto task = a.initRoot<schema::CacheTask>();
  fill_cache_task(task, "r", {1, 2, 3, 4}, 256, 0);
  auto dest = b.initRoot<schema::CacheDest>();
  fill_cache_dest_ipc(dest, "r", {9});
  EXPECT_EQ(error_of(validate_pair(task.asReader(), dest.asReader())), "ok");
}

class SwapRules : public ::testing::Test {
 protected:
  std::unique_ptr<capnp::MallocMessageBuilder> owner =
      std::make_unique<capnp::MallocMessageBuilder>();
  capnp::MallocMessageBuilder& msg = *owner;
  schema::SwapTask::Builder swap = msg.initRoot<schema::SwapTask>();
  void SetUp() override {
    swap.setRequestId("swap-1");
    swap.setDirection(schema::SwapTask::Direction::EVICT);
    testing::set_list(swap.initDeviceBlockIds(3), {1, 2, 3});
    testing::set_list(swap.initHostBlockIds(3), {100, 101, 102});
  }
  std::string check() { return error_of(validate(swap.asReader(), example_limits())); }
};

TEST_F(SwapRules, AValidSwapPasses) {
  EXPECT_EQ(check(), "ok");
}

TEST_F(SwapRules, ListsOfUnequalLength) {
  testing::set_list(swap.initHostBlockIds(2), {100, 101});
  EXPECT_EQ(check(), "SwapTask 'swap-1': device_block_ids has 3 entries but host_block_ids has 2");
}

TEST_F(SwapRules, HostBlockOutOfRange) {
  swap.getHostBlockIds().set(0, 5000);
  EXPECT_EQ(check(),
            "SwapTask 'swap-1': host_block_ids[0] = 5000 is out of range: the host pool has 1024 "
            "blocks");
}

TEST_F(SwapRules, DeviceBlockTwice) {
  swap.getDeviceBlockIds().set(2, 1);
  EXPECT_EQ(check(), "SwapTask 'swap-1': device_block_ids has block 1 twice (at 0 and 2)");
}

TEST_F(SwapRules, LayersOutOfRange) {
  swap.setFirstLayer(30);
  swap.setLayerCount(4);
  EXPECT_EQ(check(), "SwapTask 'swap-1': layers [30, 34) exceed the pool's 32 layers");
}

TEST_F(SwapRules, UnknownDirection) {
  swap.setDirection(static_cast<schema::SwapTask::Direction>(5));
  EXPECT_EQ(check(), "SwapTask 'swap-1': direction 5 is unknown (expected evict or load)");
}

TEST_F(SwapRules, InstanceWithoutHostTier) {
  auto limits = example_limits();
  limits.host_blocks = 0;
  EXPECT_EQ(error_of(validate(swap.asReader(), limits)),
            "SwapTask 'swap-1': this instance has no host tier (host_blocks is 0)");
}

TEST(ConnectRules, PortsAreNeverZero) {
  capnp::MallocMessageBuilder msg;
  auto c = msg.initRoot<schema::ConnectTask>();
  c.setTaskId(7);
  c.setProtocol(schema::TransferProtocol::RDMA);
  c.setPeerAddress("198.18.0.9");
  auto ports = c.initPorts(2);
  ports.set(0, 8100);
  EXPECT_EQ(error_of(validate(c.asReader(), example_limits())),
            "ConnectTask 7: ports[1] = 0 is not a port");
}

TEST(ConnectRules, TcpPortsAreOnePerDecodeRankOfAnyTpSize) {
  capnp::MallocMessageBuilder msg;
  auto c = msg.initRoot<schema::ConnectTask>();
  c.setTaskId(8);
  c.setProtocol(schema::TransferProtocol::TCP);
  c.setPeerAddress("198.18.0.9");
  auto four = c.initPorts(4);  // a decode instance of tp 4 (heterogeneous TP)
  for (uint32_t r = 0; r < 4; ++r)
    four.set(r, static_cast<uint16_t>(8100 + r));
  EXPECT_TRUE(validate(c.asReader(), example_limits()));
  c.initPorts(0);
  EXPECT_EQ(error_of(validate(c.asReader(), example_limits())),
            "ConnectTask 8: ports has 0 entries; it needs one port per decode rank, 1 to 16");
}

TEST(ConnectRules, AddressWithASpace) {
  capnp::MallocMessageBuilder msg;
  auto c = msg.initRoot<schema::ConnectTask>();
  c.setTaskId(7);
  c.setProtocol(schema::TransferProtocol::TCP);
  c.setPeerAddress("198.18.0.9 x");
  EXPECT_EQ(error_of(validate(c.asReader(), example_limits())),
            "ConnectTask 7: peer_address contains a space or non-printable byte");
}

TEST(CancelRules, RequestIdRulesApply) {
  capnp::MallocMessageBuilder msg;
  auto c = msg.initRoot<schema::Cancel>();
  EXPECT_EQ(error_of(validate(c.asReader(), example_limits())), "Cancel: request_id is empty");
}

class RegisterPoolRules : public ::testing::Test {
 protected:
  std::unique_ptr<capnp::MallocMessageBuilder> owner =
      std::make_unique<capnp::MallocMessageBuilder>();
  capnp::MallocMessageBuilder& msg = *owner;
  schema::PoolDescriptor::Builder pool = msg.initRoot<schema::RegisterPool>().initPool();
  void SetUp() override {
    pool.setRank(1);
    pool.setLocation(schema::PoolDescriptor::Location::HOST_SEGMENT);
    pool.setSegmentName("kvrelay-x-pool-r1");
    pool.setNumLayers(32);
    pool.setNumBlocks(512);
    pool.setKvHeads(1);
    pool.setBlockSize(64);
    pool.setHeadDim(128);
  }
  std::string check() {
    return error_of(validate(msg.getRoot<schema::RegisterPool>().asReader(), example_limits()));
  }
};

TEST_F(RegisterPoolRules, AValidPoolPasses) {
  EXPECT_EQ(check(), "ok");
}

TEST_F(RegisterPoolRules, RankOutOfRange) {
  pool.setRank(2);
  EXPECT_EQ(check(), "RegisterPool rank 2: rank 2 is out of range: the instance has 2 ranks");
}

TEST_F(RegisterPoolRules, GeometryDisagreesWithTheInstance) {
  pool.setHeadDim(64);
  EXPECT_EQ(check(), "RegisterPool rank 1: head_dim is 64 but the instance is configured with 128");
}

// An MLA cache (K only) registered with an instance of K+V pools, and the
// other way round: refused naming the field.
TEST_F(RegisterPoolRules, AKOnlyPoolForAKAndVInstanceAndTheOtherWayRound) {
  pool.setHasValues(false);
  EXPECT_EQ(check(),
            "RegisterPool rank 1: has_values is 0 but the instance is configured with 1");
  pool.setHasValues(true);
  messages::Limits k_only = example_limits();
  k_only.pool.k_only = 1;
  EXPECT_EQ(error_of(validate(msg.getRoot<schema::RegisterPool>().asReader(), k_only)),
            "RegisterPool rank 1: has_values is 1 but the instance is configured with 0");
  pool.setHasValues(false);
  EXPECT_EQ(error_of(validate(msg.getRoot<schema::RegisterPool>().asReader(), k_only)), "ok");
}

TEST_F(RegisterPoolRules, SegmentNameWithASlash) {
  pool.setSegmentName("../x");
  EXPECT_EQ(check(), "RegisterPool rank 1: segment_name '../x' is not a valid segment name");
}

// Tensor tables (cudaIpc, cudaVmm, hostFd): the example instance has 32
// layers of K and V, 512 blocks of 64 tokens x 128 bf16 each: 8 MiB a tensor.
constexpr uint64_t kTensorBytes = 512ULL * 64 * 128 * 2;

class TensorTableRules : public RegisterPoolRules {
 protected:
  // `per_memory` tensors back to back in each allocation.
  void place(schema::PoolDescriptor::Location where, uint32_t per_memory) {
    pool.setLocation(where);
    const uint32_t n_memories = 64 / per_memory;
    auto memories = pool.initMemories(n_memories);
    std::array<kj::byte, 64> handle{};
    for (uint32_t m = 0; m < n_memories; ++m) {
      memories[m].setBytes(per_memory * kTensorBytes);
      memories[m].setFdIndex(m);
      if (where == schema::PoolDescriptor::Location::CUDA_IPC)
        memories[m].setIpcHandle(kj::arrayPtr(handle.data(), handle.size()));
    }
    auto tensors = pool.initTensors(64);
    for (uint32_t i = 0; i < 64; ++i) {
      tensors[i].setMemory(i / per_memory);
      tensors[i].setOffset((i % per_memory) * kTensorBytes);
    }
    if (where != schema::PoolDescriptor::Location::CUDA_IPC) pool.setFdTicket(7);
  }
};

TEST_F(TensorTableRules, OneAllocationPerTensorOrOneForAllPasses) {
  for (auto where :
       {schema::PoolDescriptor::Location::CUDA_IPC, schema::PoolDescriptor::Location::CUDA_VMM,
        schema::PoolDescriptor::Location::HOST_FD}) {
    for (uint32_t per_memory : {1U, 2U, 64U}) {
      place(where, per_memory);
      EXPECT_EQ(check(), "ok") << static_cast<int>(where) << " " << per_memory;
    }
  }
}

TEST_F(TensorTableRules, EveryTensorMustBePlaced) {
  place(schema::PoolDescriptor::Location::CUDA_IPC, 1);
  pool.initTensors(3);
  EXPECT_EQ(
      check(),
      "RegisterPool rank 1: tensors has 3 entries but the pool has 64 tensors (32 layers x 2)");
}

TEST_F(TensorTableRules, ATensorOutsideItsAllocationIsRefused) {
  place(schema::PoolDescriptor::Location::CUDA_VMM, 2);
  pool.getTensors()[5].setOffset(kTensorBytes + 4096);
  EXPECT_EQ(check(),
            "RegisterPool rank 1: tensors[5] (layer 2 V) needs bytes [8392704, 16781312) "
            "of memory 2, which has 16777216");
}

TEST_F(TensorTableRules, AnOffsetNearTheTopDoesNotWrapAround) {
  place(schema::PoolDescriptor::Location::CUDA_VMM, 2);
  pool.getTensors()[0].setOffset(UINT64_MAX - 15);
  EXPECT_NE(check().find("needs bytes"), std::string::npos) << check();
}

TEST_F(TensorTableRules, AMisalignedTensorIsRefused) {
  place(schema::PoolDescriptor::Location::HOST_FD, 64);
  pool.getMemories()[0].setBytes(65 * kTensorBytes);
  pool.getTensors()[63].setOffset(63 * kTensorBytes + 8);
  EXPECT_EQ(check(),
            "RegisterPool rank 1: tensors[63] (layer 31 V) is at offset 528482312, not a "
            "multiple of 16");
}

TEST_F(TensorTableRules, OverlappingTensorsAreRefusedNamingBoth) {
  place(schema::PoolDescriptor::Location::CUDA_IPC, 64);
  pool.getTensors()[9].setOffset(8 * kTensorBytes + 4096);  // into tensors[8]
  EXPECT_EQ(check(),
            "RegisterPool rank 1: tensors[8] and tensors[9] overlap in memory 0 (bytes "
            "[67108864, 75497472) and [67112960, 75501568))");
}

TEST_F(TensorTableRules, AnAllocationThatHoldsNoTensorIsAMistake) {
  place(schema::PoolDescriptor::Location::CUDA_IPC, 2);  // 32 allocations
  auto memories = pool.initMemories(33);
  std::array<kj::byte, 64> handle{};
  for (uint32_t m = 0; m < 33; ++m) {
    memories[m].setBytes(2 * kTensorBytes);
    memories[m].setIpcHandle(kj::arrayPtr(handle.data(), handle.size()));
  }
  EXPECT_EQ(check(), "RegisterPool rank 1: memories[32] holds no tensor");
}

TEST_F(TensorTableRules, ALegacyHandleIsSixtyFourBytes) {
  place(schema::PoolDescriptor::Location::CUDA_IPC, 64);
  pool.getMemories()[0].initIpcHandle(63);
  EXPECT_EQ(check(), "RegisterPool rank 1: memories[0].ipc_handle is 63 bytes, not 64");
}

TEST_F(TensorTableRules, FilesNeedTheTicketTheyWerePassedUnder) {
  place(schema::PoolDescriptor::Location::CUDA_VMM, 1);
  pool.setFdTicket(0);
  EXPECT_EQ(check(),
            "RegisterPool rank 1: fd_ticket is 0: pass the file descriptors to the "
            "rank's worker first (the client library does)");
  pool.setFdTicket(3);
  pool.getMemories()[4].setFdIndex(64);
  EXPECT_EQ(check(),
            "RegisterPool rank 1: memories[4].fd_index is 64; 64 file descriptors were passed");
}

TEST_F(TensorTableRules, VmmChunksCoverTheirRangeBackToBackWithAnFdEach) {
  place(schema::PoolDescriptor::Location::CUDA_VMM, 64);  // one range of 512 MiB
  const uint64_t chunk = 20ULL << 20;
  const uint64_t total = 64 * kTensorBytes;
  const uint32_t n = static_cast<uint32_t>((total + chunk - 1) / chunk);
  auto chunks = pool.getMemories()[0].initChunks(n);
  for (uint32_t c = 0; c < n; ++c) {
    chunks[c].setFdIndex(n - 1 - c);  // any order of fds, each once
    chunks[c].setOffset(c * chunk);
    chunks[c].setBytes(std::min(chunk, total - c * chunk));
  }
  EXPECT_EQ(check(), "ok");
  chunks[5].setOffset(5 * chunk + 4096);
  EXPECT_EQ(check(),
            "RegisterPool rank 1: memories[0].chunks[5] is bytes [104861696, +20971520); "
            "the chunks must cover [0, 536870912) back to back, and [0, 104857600) is "
            "covered");
  chunks[5].setOffset(5 * chunk);
  chunks[7].setFdIndex(n - 1 - 6);
  EXPECT_EQ(check(), "RegisterPool rank 1: memories[0].chunks[7].fd_index 19 is used twice");
  chunks[7].setFdIndex(n - 1 - 7);
  chunks[n - 1].setBytes(1);
  EXPECT_EQ(
      check(),
      "RegisterPool rank 1: memories[0]'s chunks cover [0, 524288001) of its 536870912 bytes");
}

TEST_F(TensorTableRules, OnlyVmmMemoryHasChunks) {
  place(schema::PoolDescriptor::Location::HOST_FD, 64);
  pool.getMemories()[0].initChunks(1);
  EXPECT_EQ(check(), "RegisterPool rank 1: memories[0] has chunks, which only cuda-vmm memory has");
}

TEST_F(TensorTableRules, AnEmptyAllocationListIsRefused) {
  place(schema::PoolDescriptor::Location::HOST_FD, 1);
  pool.initMemories(0);
  EXPECT_EQ(check(), "RegisterPool rank 1: memories is empty");
}

TEST(RecordSizeRule, OversizedMessageNamesBothSizesAndTheRing) {
  EXPECT_EQ(error_of(validate_record_size("CacheTask", "r-1", 70000, 65528, "submit ring")),
            "CacheTask 'r-1': encoded size 70000 bytes exceeds the submit ring's record limit of "
            "65528 bytes");
  EXPECT_TRUE(validate_record_size("CacheTask", "r-1", 65528, 65528, "submit ring").ok());
}

}  // namespace
}  // namespace kvrelay::messages
