#include <array>
#include <bitset>

#include "kernels/copy_engine.h"

namespace kvrelay::kernels {

const char* memory_kind_name(MemoryKind kind) {
  return kind == MemoryKind::kHost ? "host" : "cuda";
}

namespace {

class HostCopyEngine final : public CopyEngine {
 public:
  // A layer's batch has a copy per tensor and destination: a few, or a few
  // dozen for a split across many decode ranks.
  static constexpr size_t kMaxInterleaved = 64;

  const char* name() const override { return "host memcpy"; }
  bool reaches(MemoryKind kind) const override { return kind == MemoryKind::kHost; }
  // Copies that read one source tensor (the same layer's K, say, to each
  // decode rank of a heterogeneous-TP split) go a run of each in turn
  // (copy_runs_host_interleaved); the rest one after the other.
  Result<CopyTicket> submit(std::span<const TensorCopy> batch) override {
    if (batch.size() > kMaxInterleaved) {
      for (const TensorCopy& c : batch)
        copy_runs_host(c.src, c.dst, c.runs, /*stream=*/!c.read_soon);
      return ++submitted_;
    }
    std::bitset<kMaxInterleaved> taken;
    std::array<RunsBetween, kMaxInterleaved> group;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (taken[i]) continue;
      size_t members = 0;
      for (size_t j = i; j < batch.size(); ++j) {
        if (taken[j] || batch[j].src != batch[i].src || batch[j].read_soon != batch[i].read_soon)
          continue;
        taken[j] = true;
        group[members++] = RunsBetween{batch[j].src, batch[j].dst, batch[j].runs};
      }
      copy_runs_host_interleaved(std::span<const RunsBetween>(group.data(), members),
                                 /*stream=*/!batch[i].read_soon);
    }
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
