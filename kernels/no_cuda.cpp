// A build without CUDA (no nvcc, or KVRELAY_CUDA=OFF): the CUDA engine is
// refused with a reason, and everything on host memory works as before.
#include "kernels/copy_engine.h"
#include "kernels/device_export.h"
#include "kernels/device_memory.h"
#include "kernels/dmabuf.h"
#include "kernels/gpu_identity.h"
#include "kernels/host_pinning.h"
#include "kernels/stream_marks.h"
#include "kernels/stream_signals.h"

namespace kvrelay::kernels {

namespace {
constexpr const char* kNoCuda =
    "this kvrelay was built without CUDA (configure with nvcc available, or KVRELAY_CUDA=ON)";
}

bool cuda_built_in() {
  return false;
}

Status cuda_device_usable(int) {
  return make_error(Errc::kUnsupported, kNoCuda);
}

Result<std::unique_ptr<CopyEngine>> make_cuda_copy_engine(const CudaCopyOptions&) {
  return make_error(Errc::kUnsupported, kNoCuda);
}

Result<DmabufSpan> export_dmabuf(const std::byte*) {
  return make_error(Errc::kUnsupported, kNoCuda);
}

}  // namespace kvrelay::kernels

namespace kvrelay::kernels {

Result<PinnedHostRange> PinnedHostRange::pin(void*, size_t, bool, int) {
  return make_error(Errc::kUnsupported, kNoCuda);
}
PinnedHostRange::PinnedHostRange(PinnedHostRange&&) noexcept {}
PinnedHostRange& PinnedHostRange::operator=(PinnedHostRange&&) noexcept {
  return *this;
}
PinnedHostRange::~PinnedHostRange() = default;
void PinnedHostRange::release() {}

}  // namespace kvrelay::kernels

namespace kvrelay::kernels {

Result<ImportedDeviceMemory> ImportedDeviceMemory::open_ipc(int, std::span<const std::byte>,
                                                            uint64_t) {
  return make_error(Errc::kUnsupported, kNoCuda);
}
Result<ImportedDeviceMemory> ImportedDeviceMemory::open_vmm(int, std::span<const VmmPiece>,
                                                            uint64_t) {
  return make_error(Errc::kUnsupported, kNoCuda);
}
ImportedDeviceMemory::ImportedDeviceMemory(ImportedDeviceMemory&&) noexcept {}
ImportedDeviceMemory& ImportedDeviceMemory::operator=(ImportedDeviceMemory&&) noexcept {
  return *this;
}
ImportedDeviceMemory::~ImportedDeviceMemory() = default;
void ImportedDeviceMemory::release() {}

}  // namespace kvrelay::kernels

namespace kvrelay::kernels {

Result<ExportedPool> export_device_tensors(std::span<const uint64_t>, std::span<const uint64_t>) {
  return make_error(Errc::kUnsupported, kNoCuda);
}

}  // namespace kvrelay::kernels

namespace kvrelay::kernels {

Result<std::unique_ptr<LayerSignalWriter>> LayerSignalWriter::open(std::atomic<uint64_t>*) {
  return make_error(Errc::kUnsupported, kNoCuda);
}
LayerSignalWriter::~LayerSignalWriter() = default;
Status LayerSignalWriter::begin_step(void*, uint64_t) {
  return make_error(Errc::kUnsupported, kNoCuda);
}
Status LayerSignalWriter::signal_layer(void*, uint32_t) {
  return make_error(Errc::kUnsupported, kNoCuda);
}
Status stream_wait_at_least(void*, const PinnedHostRange&, const void*, uint64_t) {
  return make_error(Errc::kUnsupported, kNoCuda);
}
// Without CUDA nothing can have been enqueued.
StreamMarks::~StreamMarks() = default;
Status StreamMarks::mark(void*) {
  return {};
}
bool StreamMarks::done_within(std::chrono::milliseconds) {
  return true;
}
size_t StreamMarks::streams() const {
  return 0;
}

Result<GpuUuid> gpu_uuid(int) {
  return make_error(Errc::kUnsupported, kNoCuda);
}
Result<std::vector<GpuUuid>> visible_gpu_uuids() {
  return make_error(Errc::kUnsupported, kNoCuda);
}

}  // namespace kvrelay::kernels
