// Which GPU a registration names, in the worker's process
// (kernels/gpu_identity.h): by UUID, whatever ordinal the engine's process
// gave it. Before, the worker took the engine's ordinal as its own, so under
// a per-rank CUDA_VISIBLE_DEVICES every rank's pool was "GPU 0".
#include "kernels/gpu_identity.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvrelay::kernels {
namespace {

GpuUuid uuid_of(uint8_t seed) {
  GpuUuid u{};
  for (size_t i = 0; i < u.size(); ++i) u[i] = static_cast<uint8_t>(seed + i);
  return u;
}

TEST(GpuIdentity, AnEngineRanksGpuZeroIsFoundByItsUuidAmongTheWorkersGpus) {
  // The engine ran with CUDA_VISIBLE_DEVICES=3: its GPU 0 is this
  // process's GPU 3.
  const std::vector<GpuUuid> visible = {uuid_of(0x10), uuid_of(0x20), uuid_of(0x30),
                                        uuid_of(0x40)};
  const GpuUuid engine_gpu = uuid_of(0x40);
  Result<int> local = resolve_gpu(engine_gpu, /*engine_ordinal=*/0, visible);
  ASSERT_TRUE(local) << local.error().message;
  EXPECT_EQ(*local, 3);
}

TEST(GpuIdentity, AGpuTheWorkerCannotSeeIsRefusedNamingItAndTheEnginesOrdinal) {
  const std::vector<GpuUuid> visible = {uuid_of(0x10)};
  Result<int> local = resolve_gpu(uuid_of(0xa0), 2, visible);
  ASSERT_FALSE(local);
  EXPECT_EQ(local.code(), Errc::kNotFound);
  EXPECT_NE(local.error().message.find("GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf"),
            std::string::npos)
      << local.error().message;
  EXPECT_NE(local.error().message.find("the engine's GPU 2"), std::string::npos);
  EXPECT_NE(local.error().message.find("CUDA_VISIBLE_DEVICES"), std::string::npos);
}

TEST(GpuIdentity, ARegistrationWithoutAUuidKeepsTheOrdinalItNames) {
  Result<int> local = resolve_gpu({}, 5, {});
  ASSERT_TRUE(local);
  EXPECT_EQ(*local, 5);
}

TEST(GpuIdentity, AUuidOfTheWrongLengthIsRefused) {
  const std::vector<uint8_t> short_uuid(8, 1);
  Result<int> local = resolve_gpu(short_uuid, 0, {});
  ASSERT_FALSE(local);
  EXPECT_EQ(local.code(), Errc::kInvalidArgument);
}

}  // namespace
}  // namespace kvrelay::kernels
