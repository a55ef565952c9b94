#include "worker/rdma/registered_pool.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvrelay::worker::rdma {

Result<std::unique_ptr<RegisteredPool>> RegisteredPool::create(
    Fabric& fabric, const LocalPool& pool, const kernels::DmabufExporter& exporter) {
  const PoolGeometry& g = pool.geometry();
  const uint32_t per_layer = g.tensors_per_layer();
  struct Span {
    uint64_t begin, end;
    size_t index;  // layer * per_layer + tensor
  };
  std::vector<Span> spans;
  for (uint32_t l = 0; l < g.total_layers(); ++l)
    for (uint32_t t = 0; t < per_layer; ++t) {  // by slot: K, V, K scale, V scale, as present
      const PoolTensor tensor = g.tensor_at(t);
      const std::byte* base = pool.tensor(l, tensor);
      if (base == nullptr)
        return make_error(Errc::kInvalidArgument,
                          fmt::format("pool {} has no layer {} tensor {} to register for rdma",
                                      pool.name(), l, tensor_name(tensor)));
      const auto at = reinterpret_cast<uint64_t>(base);
      spans.push_back({at, at + g.tensor_bytes(l, tensor), size_t{l} * per_layer + t});
    }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });

  std::unique_ptr<RegisteredPool> r(new RegisteredPool(pool));
  r->tensors_.assign(spans.size(), RemoteTensor{});
  r->keys_.assign(spans.size(), Keys{});
  const bool gpu = pool.memory_kind() != kernels::MemoryKind::kHost;
  r->windows_ = fabric.windows_supported().ok();
  const RemoteAccess access = r->windows_ ? RemoteAccess::kWindowsOnly : RemoteAccess::kWrite;
  for (size_t i = 0; i < spans.size();) {
    // Tensors back to back (or overlapping) share one registration; in GPU
    // memory, only as far as the dma-buf of the first one's allocation goes.
    Result<kernels::DmabufSpan> dmabuf =
        gpu ? exporter(reinterpret_cast<const std::byte*>(spans[i].begin))
            : Result<kernels::DmabufSpan>(make_error(Errc::kUnsupported, "host memory"));
    const uint64_t limit = dmabuf ? spans[i].begin + dmabuf->bytes : UINT64_MAX;
    size_t j = i + 1;
    uint64_t end = spans[i].end;
    while (j < spans.size() && spans[j].begin <= end && spans[j].end <= limit) {
      end = std::max(end, spans[j].end);
      ++j;
    }
    const auto bytes = static_cast<size_t>(end - spans[i].begin);
    Result<std::unique_ptr<Registration>> reg =
        make_error(Errc::kUnsupported, "not registered");  // replaced below
    if (dmabuf && end <= limit) {
      reg = fabric.register_dmabuf(dmabuf->fd.get(), dmabuf->offset, bytes, spans[i].begin,
                                   access);
      if (reg) ++r->dmabuf_registrations_;
    }
    if (!reg) {
      const std::string why_not_dmabuf =
          !gpu          ? ""
          : !dmabuf     ? dmabuf.error().message
          : end > limit ? fmt::format("the tensor at {:#x} runs past its allocation's dma-buf",
                                      spans[i].begin)
                        : reg.error().message;
      reg = fabric.register_memory(reinterpret_cast<void*>(spans[i].begin), bytes, access);
      if (!reg && gpu)
        return make_error(
            reg.code(),
            fmt::format("registering GPU pool {} on {} for GPUDirect RDMA: as a dma-buf: {}; "
                        "by device address (needs nvidia-peermem): {}. Use tcp, which stages "
                        "GPU memory through host memory",
                        pool.name(), fabric.name(), why_not_dmabuf, reg.error().message));
      if (!reg)
        return make_error(reg.code(), fmt::format("registering pool {} on {}: {}", pool.name(),
                                                  fabric.name(), reg.error().message));
    }
    for (size_t k = i; k < j; ++k) {
      const Span& s = spans[k];
      r->tensors_[s.index] = RemoteTensor{s.begin, (*reg)->rkey(), s.end - s.begin};
      r->keys_[s.index] = Keys{s.begin, (*reg)->lkey(), reg->get()};
    }
    r->registrations_.push_back(std::move(reg).value());
    i = j;
  }
  return r;
}

}  // namespace kvrelay::worker::rdma
