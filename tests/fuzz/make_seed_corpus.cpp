// Writes the checked-in seed corpus of decode_validate_fuzzer: one valid
// message of each kind (and a few near-misses), each prefixed with its
// selector byte. Run: make_seed_corpus <dir>.
#include <capnp/message.h>

#include <array>
#include <fstream>
#include <string>
#include <vector>

#include "schemas/codec.h"

using namespace kvrelay;
using namespace kvrelay::messages;

namespace {

void save(const std::string& dir, const std::string& name, uint8_t selector,
          capnp::MessageBuilder& msg) {
  std::vector<std::byte> bytes(encoded_bytes(msg));
  encode_into(msg, bytes);
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.put(static_cast<char>(selector));
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

void fill_task(schema::CacheTask::Builder t, uint32_t blocks) {
  t.setRequestId("req-1");
  auto ids = t.initSrcBlockIds(blocks);
  for (uint32_t i = 0; i < blocks; ++i)
    ids.set(i, i * 3 % 512);
  t.setNeedPrefillTokens(blocks * 64);
  t.setEngineSlot(5);
}

void fill_dest(schema::CacheDest::Builder d, uint32_t blocks, schema::TransferProtocol p) {
  d.setRequestId("req-1");
  auto ids = d.initDestBlockIds(blocks);
  for (uint32_t i = 0; i < blocks; ++i)
    ids.set(i, 100 + i);
  d.setProtocol(p);
  d.setPeerInstance("decode0");
  d.setPeerAddress("198.18.0.2");
  auto ports = p == schema::TransferProtocol::TCP ? d.initTcpPorts(2) : d.initRdmaPorts(2);
  ports.set(0, 9000);
  ports.set(1, 9001);
  auto dev = d.initDeviceIds(2);
  dev.set(0, 0);
  dev.set(1, 1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  {
    capnp::MallocMessageBuilder m;
    fill_task(m.initRoot<schema::CacheTask>(), 8);
    save(dir, "cache_task", 0, m);
  }
  {
    capnp::MallocMessageBuilder m;
    auto t = m.initRoot<schema::CacheTask>();
    fill_task(t, 2);
    t.setLegacyPrefillStep(100004);
    save(dir, "cache_task_legacy", 0, m);
  }
  for (auto [name, p] : {std::pair{"cache_dest_ipc", schema::TransferProtocol::IPC},
                         std::pair{"cache_dest_tcp", schema::TransferProtocol::TCP},
                         std::pair{"cache_dest_rdma", schema::TransferProtocol::RDMA}}) {
    capnp::MallocMessageBuilder m;
    fill_dest(m.initRoot<schema::CacheDest>(), 6, p);
    save(dir, name, 1, m);
  }
  {
    capnp::MallocMessageBuilder m;
    auto s = m.initRoot<schema::SwapTask>();
    s.setRequestId("swap-1");
    s.setDirection(schema::SwapTask::Direction::LOAD);
    auto d = s.initDeviceBlockIds(3);
    auto h = s.initHostBlockIds(3);
    for (uint32_t i = 0; i < 3; ++i) {
      d.set(i, i);
      h.set(i, 10 + i);
    }
    s.setFirstLayer(2);
    s.setLayerCount(4);
    save(dir, "swap_task", 2, m);
  }
  {
    capnp::MallocMessageBuilder m;
    auto c = m.initRoot<schema::ConnectTask>();
    c.setTaskId(9);
    c.setProtocol(schema::TransferProtocol::RDMA);
    c.setPeerAddress("198.18.0.3");
    auto ports = c.initPorts(2);
    ports.set(0, 1);
    ports.set(1, 2);
    save(dir, "connect_task", 3, m);
  }
  {
    capnp::MallocMessageBuilder m;
    m.initRoot<schema::Cancel>().setRequestId("req-1");
    save(dir, "cancel", 4, m);
  }
  {
    capnp::MallocMessageBuilder m;
    auto p = m.initRoot<schema::RegisterPool>().initPool();
    p.setRank(1);
    p.setLocation(schema::PoolDescriptor::Location::CUDA_IPC);
    p.setNumLayers(32);
    p.setExtraLayers(1);
    p.setExtraLayerBlocks(64);
    p.setNumBlocks(512);
    p.setKvHeads(1);
    p.setBlockSize(64);
    p.setHeadDim(128);
    // Layer-major K, V of 33 layers, two allocations: layers 0..15 in the
    // first, 16..32 in the second.
    const uint64_t tensor = 512ULL * 64 * 128 * 2;
    auto memories = p.initMemories(2);
    std::array<kj::byte, 64> h{};
    memories[0].setIpcHandle(kj::arrayPtr(h.data(), h.size()));
    memories[0].setBytes(32 * tensor);
    memories[1].setIpcHandle(kj::arrayPtr(h.data(), h.size()));
    memories[1].setBytes(34 * tensor);
    auto tensors = p.initTensors(66);
    for (uint32_t i = 0; i < 66; ++i) {
      tensors[i].setMemory(i < 32 ? 0 : 1);
      tensors[i].setOffset((i < 32 ? i : i - 32) * tensor);
    }
    save(dir, "register_pool_cuda", 5, m);
  }
  {
    // VMM memory in 2 MiB chunks, by fd: the fuzzer's instance (32 layers
    // of 512 blocks, one extra layer of 64), K and V back to back.
    capnp::MallocMessageBuilder m;
    auto p = m.initRoot<schema::RegisterPool>().initPool();
    p.setRank(0);
    p.setLocation(schema::PoolDescriptor::Location::CUDA_VMM);
    p.setNumLayers(32);
    p.setExtraLayers(1);
    p.setExtraLayerBlocks(64);
    p.setNumBlocks(512);
    p.setKvHeads(1);
    p.setBlockSize(64);
    p.setHeadDim(128);
    p.setFdTicket(0x1234);
    p.setOwnerPid(4242);
    const uint64_t block = 64ULL * 128 * 2;
    auto tensors = p.initTensors(66);
    uint64_t offset = 0;
    for (uint32_t i = 0; i < 66; ++i) {
      tensors[i].setOffset(offset);
      offset += (i < 64 ? 512 : 64) * block;
    }
    const uint64_t chunk = 2ULL << 20;
    auto memories = p.initMemories(1);
    memories[0].setBytes(offset);
    auto chunks = memories[0].initChunks(static_cast<uint32_t>(offset / chunk));
    for (uint32_t c = 0; c < chunks.size(); ++c) {
      chunks[c].setFdIndex(c);
      chunks[c].setOffset(c * chunk);
      chunks[c].setBytes(chunk);
    }
    save(dir, "register_pool_vmm", 5, m);
  }
  {
    capnp::MallocMessageBuilder m;
    auto s = m.initRoot<schema::SendTask>();
    fill_task(s.initTask(), 8);
    fill_dest(s.initDest(), 5, schema::TransferProtocol::IPC);
    save(dir, "send_pair", 6, m);
  }
  return 0;
}
