#include "kernels/gpu_identity.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

namespace kvrelay::kernels {

std::string gpu_uuid_text(std::span<const uint8_t> uuid) {
  std::string out = "GPU-";
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += fmt::format("{:02x}", uuid[i]);
  }
  return out;
}

Result<int> resolve_gpu(std::span<const uint8_t> uuid, uint32_t engine_ordinal,
                        std::span<const GpuUuid> visible) {
  if (uuid.empty()) return static_cast<int>(engine_ordinal);
  if (uuid.size() != GpuUuid{}.size())
    return make_error(Errc::kInvalidArgument,
                      fmt::format("a GPU UUID of {} bytes (16 expected)", uuid.size()));
  for (size_t i = 0; i < visible.size(); ++i)
    if (std::equal(uuid.begin(), uuid.end(), visible[i].begin())) return static_cast<int>(i);
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  return make_error(
      Errc::kNotFound,
      fmt::format("the pool is on {} (the engine's GPU {}), which is not among the {} GPU(s) "
                  "this worker sees (CUDA_VISIBLE_DEVICES={}): start the workers with every GPU "
                  "of their engine ranks visible",
                  gpu_uuid_text(uuid), engine_ordinal, visible.size(),
                  env != nullptr ? fmt::format("'{}'", env) : std::string("unset")));
}

}  // namespace kvrelay::kernels
