#include "worker/imported_pool.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "schemas/pool_descriptor.h"

namespace kvrelay::worker {

using Location = schema::PoolDescriptor::Location;

bool is_gpu_location(Location location) {
  return location == Location::CUDA_IPC || location == Location::CUDA_VMM;
}

const char* location_name(Location location) {
  switch (location) {
    case Location::HOST_SEGMENT: return "host-segment";
    case Location::CUDA_IPC: return "cuda-ipc";
    case Location::CUDA_VMM: return "cuda-vmm";
    case Location::HOST_FD: return "host-fd";
  }
  return "unknown";
}

namespace {

// A memfd sealed against shrinking, at least `bytes` long, mapped shared.
Result<std::byte*> map_sealed_memfd(int fd, uint64_t bytes, uint32_t index) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("memories[{}]: a host-fd allocation must be a memfd sealed with "
                                  "F_SEAL_SHRINK (memfd_create(MFD_ALLOW_SEALING), then "
                                  "fcntl(F_ADD_SEALS)), so that nobody can truncate it under "
                                  "the worker",
                                  index));
  struct stat st {};
  if (fstat(fd, &st) != 0) return system_error("fstat of a passed fd", errno);
  if (static_cast<uint64_t>(st.st_size) < bytes)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("memories[{}]: the memfd has {} bytes, not the {} its "
                                  "registration says",
                                  index, st.st_size, bytes));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return system_error(fmt::format("mmap of memories[{}]", index), errno);
  return static_cast<std::byte*>(p);
}

}  // namespace

ImportedPool::ImportedPool(PoolGeometry geometry, std::string name, kernels::MemoryKind kind,
                           int device)
    : geometry_(geometry), name_(std::move(name)), kind_(kind), device_(device) {}

ImportedPool::~ImportedPool() {
  for (const HostMapping& m : host_)
    munmap(m.base, m.bytes);
}

Result<std::unique_ptr<ImportedPool>> ImportedPool::open(schema::PoolDescriptor::Reader d,
                                                         const PoolGeometry& expected,
                                                         std::span<const UniqueFd> fds, int device,
                                                         std::string name) {
  const Location where = d.getLocation();
  if (where == Location::HOST_SEGMENT)
    return make_error(Errc::kInvalidArgument, "a host segment is no tensor table");
  const PoolGeometry g = messages::shape_of(d);
  if (g != expected)
    return make_error(Errc::kInvalidArgument,
                      "the pool's shape is not this instance's (check the registration)");
  const bool gpu = is_gpu_location(where);
  std::unique_ptr<ImportedPool> pool(new ImportedPool(
      g, std::move(name), gpu ? kernels::MemoryKind::kCuda : kernels::MemoryKind::kHost, device));
  const auto memories = d.getMemories();
  // One fd per allocation: a memory, or each chunk of a chunked one.
  size_t allocations = 0;
  for (const auto m : memories)
    allocations += m.getChunks().size() != 0 ? m.getChunks().size() : 1;
  if (where != Location::CUDA_IPC && fds.size() != allocations)
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("{} file descriptors were passed for {} allocations", fds.size(), allocations));
  const auto fd_at = [&](uint32_t index) -> Result<int> {
    if (index < fds.size()) return fds[index].get();
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("fd_index {} names none of the {} file descriptors passed", index, fds.size()));
  };
  std::vector<std::byte*> bases;
  for (uint32_t i = 0; i < memories.size(); ++i) {
    const auto m = memories[i];
    const uint64_t bytes = m.getBytes();
    const auto fail = [&](const Error& e) {
      return make_error(e.code, fmt::format("{} pool, memories[{}] ({} bytes): {}",
                                            location_name(where), i, bytes, e.message));
    };
    if (where == Location::HOST_FD) {
      Result<int> fd = fd_at(m.getFdIndex());
      if (!fd) return fail(fd.error());
      Result<std::byte*> base = map_sealed_memfd(*fd, bytes, i);
      if (!base) return base.error();
      pool->host_.push_back(HostMapping{*base, bytes});
      bases.push_back(*base);
    } else if (where == Location::CUDA_IPC) {
      Result<kernels::ImportedDeviceMemory> mem = kernels::ImportedDeviceMemory::open_ipc(
          device, std::as_bytes(std::span(m.getIpcHandle().begin(), m.getIpcHandle().size())),
          bytes);
      if (!mem) return fail(mem.error());
      bases.push_back(mem->base());
      pool->device_memory_.push_back(std::move(mem).value());
    } else {
      std::vector<kernels::VmmPiece> pieces;
      if (m.getChunks().size() == 0) {
        Result<int> fd = fd_at(m.getFdIndex());
        if (!fd) return fail(fd.error());
        pieces.push_back(kernels::VmmPiece{*fd, 0, bytes});
      }
      for (const auto c : m.getChunks()) {
        Result<int> fd = fd_at(c.getFdIndex());
        if (!fd) return fail(fd.error());
        pieces.push_back(kernels::VmmPiece{*fd, c.getOffset(), c.getBytes()});
      }
      Result<kernels::ImportedDeviceMemory> mem =
          kernels::ImportedDeviceMemory::open_vmm(device, pieces, bytes);
      if (!mem) return fail(mem.error());
      bases.push_back(mem->base());
      pool->device_memory_.push_back(std::move(mem).value());
    }
    pool->bytes_ += bytes;
  }
  for (const auto place : d.getTensors())
    pool->tensors_.push_back(bases[place.getMemory()] + place.getOffset());
  return pool;
}

std::vector<std::span<std::byte>> ImportedPool::host_memory() const {
  std::vector<std::span<std::byte>> out;
  for (const HostMapping& m : host_)
    out.emplace_back(m.base, m.bytes);
  return out;
}

std::byte* ImportedPool::tensor(uint32_t layer, PoolTensor t) const {
  if (layer >= geometry_.total_layers() || !geometry_.has_tensor(t)) return nullptr;
  return tensors_[size_t{layer} * geometry_.tensors_per_layer() + geometry_.slot_of(t)];
}

}  // namespace kvrelay::worker
