#include "worker/rdma/registered_pool.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvrelay::worker::rdma {

Result<std::unique_ptr<RegisteredPool>> RegisteredPool::create(Fabric& fabric,
                                                                   const LocalPool& pool) {
  const PoolGeometry& g = pool.geometry();
  const uint32_t per_layer = g.tensors_per_layer();
  struct Span {
    uint64_t begin, end;
    size_t index;  // layer * per_layer + tensor
  };
  std::vector<Span> spans;
  for (uint32_t l = 0; l < g.total_layers(); ++l)
    for (uint32_t t = 0; t < per_layer; ++t) {
      const std::byte* base = pool.tensor(l, static_cast<PoolTensor>(t));
      if (base == nullptr)
        return make_error(Errc::kInvalidArgument,
                          fmt::format("pool {} has no layer {} tensor {} to register for rdma",
                                      pool.name(), l, t));
      const auto at = reinterpret_cast<uint64_t>(base);
      spans.push_back({at, at + g.tensor_bytes(l, static_cast<PoolTensor>(t)),
                       size_t{l} * per_layer + t});
    }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });

  std::unique_ptr<RegisteredPool> r(new RegisteredPool(pool));
  r->tensors_.assign(spans.size(), RemoteTensor{});
  r->keys_.assign(spans.size(), Keys{});
  for (size_t i = 0; i < spans.size();) {
    // Tensors back to back (or overlapping) share one registration.
    size_t j = i + 1;
    uint64_t end = spans[i].end;
    while (j < spans.size() && spans[j].begin <= end) {
      end = std::max(end, spans[j].end);
      ++j;
    }
    Result<std::unique_ptr<Registration>> reg = fabric.register_memory(
        reinterpret_cast<void*>(spans[i].begin), static_cast<size_t>(end - spans[i].begin));
    if (!reg)
      return make_error(reg.code(), fmt::format("registering pool {} on {}: {}", pool.name(),
                                                fabric.name(), reg.error().message));
    for (size_t k = i; k < j; ++k) {
      const Span& s = spans[k];
      r->tensors_[s.index] = RemoteTensor{s.begin, (*reg)->rkey(), s.end - s.begin};
      r->keys_[s.index] = Keys{s.begin, (*reg)->lkey()};
    }
    r->registrations_.push_back(std::move(reg).value());
    i = j;
  }
  return r;
}

}  // namespace kvrelay::worker::rdma
