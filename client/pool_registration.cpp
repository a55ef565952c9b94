#include "client/pool_registration.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "schemas/pool_descriptor.h"

namespace kvrelay::client {

namespace {

schema::PoolDescriptor::Location location_of(PoolLocation l) {
  switch (l) {
    case PoolLocation::kHostSegment: return schema::PoolDescriptor::Location::HOST_SEGMENT;
    case PoolLocation::kCudaIpc: return schema::PoolDescriptor::Location::CUDA_IPC;
    case PoolLocation::kCudaVmm: return schema::PoolDescriptor::Location::CUDA_VMM;
    case PoolLocation::kHostFd: return schema::PoolDescriptor::Location::HOST_FD;
  }
  // An out-of-range value stays out of range: validation names it.
  return static_cast<schema::PoolDescriptor::Location>(l);
}

}  // namespace

void describe(const PoolSpec& spec, const PoolGeometry& geometry, uint64_t fd_ticket,
              schema::PoolDescriptor::Builder d) {
  d.setRank(spec.rank);
  d.setTier(spec.tier == PoolTier::kHost ? schema::PoolDescriptor::Tier::HOST
                                         : schema::PoolDescriptor::Tier::DEVICE);
  d.setLocation(location_of(spec.location));
  d.setSegmentName(spec.segment_name);
  d.setDeviceId(spec.device_id);
  if (std::any_of(spec.device_uuid.begin(), spec.device_uuid.end(), [](uint8_t b) { return b != 0; }))
    d.setDeviceUuid(kj::arrayPtr(spec.device_uuid.data(), spec.device_uuid.size()));
  d.setFdTicket(fd_ticket);
  if (spec.location != PoolLocation::kHostSegment) d.setOwnerPid(static_cast<uint32_t>(getpid()));
  messages::set_shape(d, geometry);
  if (spec.location == PoolLocation::kHostSegment) return;
  auto memories = d.initMemories(static_cast<uint32_t>(spec.memories.size()));
  uint32_t next_fd = 0;
  for (uint32_t i = 0; i < spec.memories.size(); ++i) {
    const PoolMemorySpec& m = spec.memories[i];
    memories[i].setBytes(m.bytes);
    if (spec.location == PoolLocation::kCudaIpc)
      memories[i].setIpcHandle(kj::arrayPtr(m.cuda_ipc_handle.data(), m.cuda_ipc_handle.size()));
    if (m.chunks.empty()) {
      if (spec.location != PoolLocation::kCudaIpc) memories[i].setFdIndex(next_fd++);
      continue;
    }
    auto chunks = memories[i].initChunks(static_cast<uint32_t>(m.chunks.size()));
    for (uint32_t c = 0; c < m.chunks.size(); ++c) {
      chunks[c].setFdIndex(next_fd++);
      chunks[c].setOffset(m.chunks[c].offset);
      chunks[c].setBytes(m.chunks[c].bytes);
    }
  }
  auto tensors = d.initTensors(static_cast<uint32_t>(spec.tensors.size()));
  for (uint32_t i = 0; i < spec.tensors.size(); ++i) {
    tensors[i].setMemory(spec.tensors[i].memory);
    tensors[i].setOffset(spec.tensors[i].offset);
  }
}

std::vector<int> fds_of(const PoolSpec& spec) {
  std::vector<int> fds;
  if (spec.location != PoolLocation::kCudaVmm && spec.location != PoolLocation::kHostFd) return fds;
  for (const PoolMemorySpec& m : spec.memories) {
    if (m.chunks.empty()) fds.push_back(m.fd);
    for (const PoolChunkSpec& c : m.chunks)
      fds.push_back(c.fd);
  }
  return fds;
}

PoolSpec spec_of(uint32_t rank, PoolTier tier, const kernels::ExportedPool& pool) {
  PoolSpec spec;
  spec.rank = rank;
  spec.tier = tier;
  spec.device_id = static_cast<uint32_t>(pool.device);
  spec.device_uuid = pool.device_uuid;
  // One location per pool: the registration's memory is all of one kind.
  spec.location = !pool.ranges.empty() && pool.ranges.front().vmm ? PoolLocation::kCudaVmm
                                                                  : PoolLocation::kCudaIpc;
  for (const kernels::ExportedRange& r : pool.ranges) {
    PoolMemorySpec m;
    m.bytes = r.bytes;
    std::memcpy(m.cuda_ipc_handle.data(), r.ipc_handle.data(), r.ipc_handle.size());
    if (r.chunks.size() == 1) {
      m.fd = r.chunks.front().fd.get();
    } else {
      for (const kernels::ExportedChunk& c : r.chunks)
        m.chunks.push_back(PoolChunkSpec{c.fd.get(), c.offset, c.bytes});
    }
    spec.memories.push_back(std::move(m));
  }
  for (const kernels::ExportedTensor& t : pool.tensors)
    spec.tensors.push_back(TensorPlacement{t.range, t.offset});
  return spec;
}

std::vector<uint64_t> tensor_sizes(const PoolGeometry& g) {
  std::vector<uint64_t> sizes;
  for (uint32_t layer = 0; layer < g.total_layers(); ++layer)
    for (uint32_t slot = 0; slot < g.tensors_per_layer(); ++slot)
      sizes.push_back(g.tensor_bytes(layer, g.tensor_at(slot)));
  return sizes;
}

}  // namespace kvrelay::client
