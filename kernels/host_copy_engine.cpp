#include "kernels/copy_engine.h"

namespace kvrelay::kernels {

const char* memory_kind_name(MemoryKind kind) {
  return kind == MemoryKind::kHost ? "host" : "cuda";
}

namespace {

class HostCopyEngine final : public CopyEngine {
 public:
  const char* name() const override { return "host memcpy"; }
  bool reaches(MemoryKind kind) const override { return kind == MemoryKind::kHost; }
  Result<CopyTicket> submit(std::span<const TensorCopy> batch) override {
    for (const TensorCopy& c : batch)
      copy_runs_host(c.src, c.dst, c.runs, /*stream=*/!c.read_soon);
    return ++submitted_;
  }
  bool done(CopyTicket) override { return true; }
  Status wait(CopyTicket) override { return {}; }
  Status failure() const override { return {}; }

 private:
  CopyTicket submitted_ = 0;
};

}  // namespace

std::unique_ptr<CopyEngine> make_host_copy_engine() {
  return std::make_unique<HostCopyEngine>();
}

Result<std::unique_ptr<CopyEngine>> make_copy_engine(MemoryKind src, MemoryKind dst,
                                                     const CudaCopyOptions& options) {
  if (src == MemoryKind::kHost && dst == MemoryKind::kHost) return make_host_copy_engine();
  return make_cuda_copy_engine(options);
}

}  // namespace kvrelay::kernels
