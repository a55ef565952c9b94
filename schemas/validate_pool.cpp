// RegisterPool's rules (schemas/validate.h): the pool's shape must be the
// instance's, and where it lives must be fully and safely described. A
// tensor table (cudaIpc, cudaVmm, hostFd) is checked here as far as the
// message alone allows: every tensor inside its allocation, aligned, and no
// two tensors overlapping (a K that aliases a V would corrupt the cache
// without a word). The worker checks the rest against what it maps.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "schemas/pool_descriptor.h"
#include "schemas/validate.h"
#include "schemas/validate_text.h"

namespace kvrelay::messages {

namespace {

using Location = schema::PoolDescriptor::Location;

using detail::entries;
using detail::invalid;

Status check_segment_name(const std::string& w, capnp::Text::Reader name) {
  const std::string_view n(name.cStr(), name.size());
  if (n.empty() || n.size() > 255 || n.find('/') != std::string_view::npos ||
      n.find("..") != std::string_view::npos)
    return invalid(
        fmt::format("{}: segment_name '{}' is not a valid segment name", w, n.substr(0, 64)));
  return {};
}

struct Placed {
  uint32_t memory;
  uint64_t begin;
  uint64_t end;
  uint32_t tensor;  // index in the tensor table
};

Status check_tensor_table(const std::string& w, schema::PoolDescriptor::Reader pool,
                          const PoolGeometry& g) {
  const Location where = pool.getLocation();
  const bool by_fd = where == Location::CUDA_VMM || where == Location::HOST_FD;
  const uint32_t per_layer = g.tensors_per_layer();
  const uint64_t want = uint64_t{g.total_layers()} * per_layer;
  const auto tensors = pool.getTensors();
  const auto memories = pool.getMemories();
  if (tensors.size() != want)
    return invalid(fmt::format("{}: tensors has {} but the pool has {} tensors ({} layers x {})", w,
                               entries(tensors.size()), want, g.total_layers(), per_layer));
  if (const size_t uuid = pool.getDeviceUuid().size(); uuid != 0 && uuid != 16)
    return invalid(fmt::format("{}: device_uuid has {} bytes; a GPU UUID has 16", w, uuid));
  if (memories.size() == 0) return invalid(fmt::format("{}: memories is empty", w));
  if (memories.size() > tensors.size())
    return invalid(fmt::format("{}: memories has {} for {} tensors", w, entries(memories.size()),
                               tensors.size()));
  if (by_fd && pool.getFdTicket() == 0)
    return invalid(
        fmt::format("{}: fd_ticket is 0: pass the file descriptors to the rank's "
                    "worker first (the client library does)",
                    w));
  // By fd: one per allocation (a memory, or each chunk of a chunked one),
  // every index once.
  uint64_t fds = 0;
  for (uint32_t i = 0; i < memories.size(); ++i)
    fds += memories[i].getChunks().size() != 0 ? memories[i].getChunks().size() : 1;
  if (by_fd && fds > kMaxPoolFds)
    return invalid(
        fmt::format("{}: {} allocations to pass by fd; at most {}", w, fds, kMaxPoolFds));
  std::vector<bool> fd_seen(by_fd ? fds : 0, false);
  const auto take_fd = [&](uint32_t index, const std::string& what) -> Status {
    if (index >= fds)
      return invalid(fmt::format("{}: {}.fd_index is {}; {} file descriptors were passed", w, what,
                                 index, fds));
    if (fd_seen[index])
      return invalid(fmt::format("{}: {}.fd_index {} is used twice", w, what, index));
    fd_seen[index] = true;
    return {};
  };
  for (uint32_t i = 0; i < memories.size(); ++i) {
    const auto m = memories[i];
    const std::string what = fmt::format("memories[{}]", i);
    if (m.getBytes() == 0) return invalid(fmt::format("{}: {} has 0 bytes", w, what));
    if (where == Location::CUDA_IPC && m.getIpcHandle().size() != kCudaIpcHandleBytes)
      return invalid(fmt::format("{}: {}.ipc_handle is {} bytes, not {}", w, what,
                                 m.getIpcHandle().size(), kCudaIpcHandleBytes));
    const auto chunks = m.getChunks();
    if (chunks.size() != 0 && where != Location::CUDA_VMM)
      return invalid(fmt::format("{}: {} has chunks, which only cuda-vmm memory has", w, what));
    if (by_fd && chunks.size() == 0)
      if (Status s = take_fd(m.getFdIndex(), what); !s) return s;
    uint64_t covered = 0;
    for (uint32_t c = 0; c < chunks.size(); ++c) {
      const std::string chunk = fmt::format("{}.chunks[{}]", what, c);
      if (chunks[c].getOffset() != covered || chunks[c].getBytes() == 0 ||
          chunks[c].getBytes() > m.getBytes() - covered)
        return invalid(fmt::format(
            "{}: {} is bytes [{}, +{}); the chunks must cover [0, {}) "
            "back to back, and [0, {}) is covered",
            w, chunk, chunks[c].getOffset(), chunks[c].getBytes(), m.getBytes(), covered));
      covered += chunks[c].getBytes();
      if (Status s = take_fd(chunks[c].getFdIndex(), chunk); !s) return s;
    }
    if (chunks.size() != 0 && covered != m.getBytes())
      return invalid(fmt::format("{}: {}'s chunks cover [0, {}) of its {} bytes", w, what, covered,
                                 m.getBytes()));
  }
  std::vector<Placed> placed;
  placed.reserve(tensors.size());
  std::vector<bool> used(memories.size(), false);
  for (uint32_t i = 0; i < tensors.size(); ++i) {
    const uint32_t layer = i / per_layer;
    const PoolTensor t = g.tensor_at(i % per_layer);
    const auto place = tensors[i];
    const std::string what = fmt::format("tensors[{}] (layer {} {})", i, layer, tensor_name(t));
    if (place.getMemory() >= memories.size())
      return invalid(fmt::format("{}: {} names memory {}; there are {}", w, what, place.getMemory(),
                                 memories.size()));
    const uint64_t bytes = g.tensor_bytes(layer, t);
    const uint64_t capacity = memories[place.getMemory()].getBytes();
    const uint64_t offset = place.getOffset();
    if (offset % kTensorAlignment != 0)
      return invalid(fmt::format("{}: {} is at offset {}, not a multiple of {}", w, what, offset,
                                 kTensorAlignment));
    if (offset > capacity || bytes > capacity - offset)
      return invalid(fmt::format("{}: {} needs bytes [{}, {}) of memory {}, which has {}", w, what,
                                 offset, offset + bytes, place.getMemory(), capacity));
    used[place.getMemory()] = true;
    if (bytes > 0) placed.push_back(Placed{place.getMemory(), offset, offset + bytes, i});
  }
  for (uint32_t i = 0; i < memories.size(); ++i)
    if (!used[i]) return invalid(fmt::format("{}: memories[{}] holds no tensor", w, i));
  std::sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
    if (a.memory != b.memory) return a.memory < b.memory;
    return a.begin != b.begin ? a.begin < b.begin : a.tensor < b.tensor;
  });
  for (size_t i = 1; i < placed.size(); ++i) {
    const Placed& a = placed[i - 1];
    const Placed& b = placed[i];
    if (a.memory == b.memory && b.begin < a.end)
      return invalid(
          fmt::format("{}: tensors[{}] and tensors[{}] overlap in memory {} (bytes "
                      "[{}, {}) and [{}, {}))",
                      w, a.tensor, b.tensor, a.memory, a.begin, a.end, b.begin, b.end));
  }
  return {};
}

}  // namespace

Status validate(schema::RegisterPool::Reader reg, const Limits& limits) {
  if (!reg.hasPool()) return invalid("RegisterPool: pool is missing");
  const auto pool = reg.getPool();
  const std::string w = fmt::format("RegisterPool rank {}", pool.getRank());
  if (pool.getRank() >= limits.tp_size)
    return invalid(fmt::format("{}: rank {} is out of range: the instance has {} ranks", w,
                               pool.getRank(), limits.tp_size));
  const auto tier = static_cast<uint16_t>(pool.getTier());
  if (tier > 1)
    return invalid(fmt::format("{}: tier {} is unknown (expected device or host)", w, tier));
  const bool host_tier = pool.getTier() == schema::PoolDescriptor::Tier::HOST;
  const uint32_t want_blocks = host_tier ? limits.host_blocks : limits.pool.num_blocks;
  const struct {
    const char* field;
    uint64_t got;
    uint64_t want;
  } geometry[] = {
      {"num_layers", pool.getNumLayers(), limits.pool.num_layers},
      {"extra_layers", pool.getExtraLayers(), limits.pool.extra_layers},
      {"num_blocks", pool.getNumBlocks(), want_blocks},
      {"extra_layer_blocks", pool.getExtraLayerBlocks(),
       limits.pool.extra_layers ? limits.pool.extra_layer_blocks : 0},
      {"kv_heads", pool.getKvHeads(), limits.pool.kv_heads},
      {"block_size", pool.getBlockSize(), limits.pool.block_size},
      {"head_dim", pool.getHeadDim(), limits.pool.head_dim},
      {"dtype", static_cast<uint64_t>(pool.getDtype()), limits.pool.dtype},
      {"has_scales", pool.getHasScales() ? 1U : 0U, limits.pool.has_scales != 0 ? 1U : 0U},
      // A K-only (MLA) cache registered as K+V, or the other way round.
      {"has_values", pool.getHasValues() ? 1U : 0U, limits.pool.k_only != 0 ? 0U : 1U},
  };
  for (const auto& g : geometry) {
    if (g.got != g.want)
      return invalid(fmt::format("{}: {} is {} but the instance is configured with {}", w, g.field,
                                 g.got, g.want));
  }
  switch (pool.getLocation()) {
    case Location::HOST_SEGMENT: return check_segment_name(w, pool.getSegmentName());
    case Location::CUDA_IPC:
    case Location::CUDA_VMM:
    case Location::HOST_FD: return check_tensor_table(w, pool, shape_of(pool));
  }
  return invalid(
      fmt::format("{}: location {} is unknown", w, static_cast<uint16_t>(pool.getLocation())));
}

}  // namespace kvrelay::messages
