// A stand-in for GPU memory on a machine without a GPU, for the paths that
// must reach a pool only through a copy engine (tcp staging).
//
// FakeDevice reserves a range of "device addresses" that the CPU cannot
// touch (PROT_NONE: a direct read or write crashes the test, as it would
// fault on real device memory) and keeps the bytes in a host mirror beside
// it. FakeDevicePool is a pool of MemoryKind::kCuda at those addresses;
// mirror() is the same pool seen through the host mirror, for filling and
// checking it; dmabuf_exporter() exports it as an RDMA NIC would see it.
// FakeDeviceEngine is the copy engine that reaches it: it
// translates device addresses to the mirror, and runs a batch's copies only
// when it is waited on, after a delay, so that whoever reads the
// destination before the copy has ended sees the old bytes.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/copy_engine.h"
#include "kernels/dmabuf.h"
#include "worker/local_pool.h"

namespace kvrelay::testing {

class FakeDevice {
 public:
  explicit FakeDevice(uint64_t bytes)
      : bytes_(bytes), fd_(::memfd_create("fake-device", MFD_CLOEXEC)) {
    (void)!::ftruncate(fd_, static_cast<off_t>(bytes));
    device_ = static_cast<std::byte*>(
        ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    mirror_ =
        static_cast<std::byte*>(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
  }
  ~FakeDevice() {
    ::munmap(device_, bytes_);
    ::munmap(mirror_, bytes_);
    ::close(fd_);
  }
  FakeDevice(const FakeDevice&) = delete;
  FakeDevice& operator=(const FakeDevice&) = delete;

  std::byte* device() const { return device_; }
  std::byte* mirror() const { return mirror_; }
  bool holds(const std::byte* p, uint64_t n) const {
    return p >= device_ && n <= bytes_ && static_cast<uint64_t>(p - device_) <= bytes_ - n;
  }
  std::byte* to_mirror(const std::byte* p) const { return mirror_ + (p - device_); }

  // A stand-in for kernels::export_dmabuf: the memory's memfd as the
  // dma-buf, the device split into allocations of `allocation_bytes`
  // (0: one), each of which a dma-buf covers to its end.
  kernels::DmabufExporter dmabuf_exporter(uint64_t allocation_bytes = 0) const {
    return [this, allocation_bytes](const std::byte* p) -> Result<kernels::DmabufSpan> {
      if (!holds(p, 1)) return make_error(Errc::kUnsupported, "fake device: not device memory");
      const auto offset = static_cast<uint64_t>(p - device_);
      const uint64_t chunk = allocation_bytes == 0 ? bytes_ : allocation_bytes;
      kernels::DmabufSpan span;
      span.fd = UniqueFd(::fcntl(fd_, F_DUPFD_CLOEXEC, 0));
      span.offset = offset;
      span.bytes = std::min(bytes_, (offset / chunk + 1) * chunk) - offset;
      return span;
    };
  }

 private:
  uint64_t bytes_;
  int fd_;
  std::byte* device_;
  std::byte* mirror_;
};

// Tensors back to back, layer by layer, from `base`.
class FlatPool final : public worker::LocalPool {
 public:
  FlatPool(const PoolGeometry& g, std::byte* base, kernels::MemoryKind kind, std::string name)
      : geometry_(g), base_(base), kind_(kind), name_(std::move(name)) {
    uint64_t at = 0;
    for (uint32_t l = 0; l < g.total_layers(); ++l)
      for (uint32_t t = 0; t < g.tensors_per_layer(); ++t) {
        offsets_.push_back(at);
        at += g.tensor_bytes(l, static_cast<PoolTensor>(t));
      }
    bytes_ = at;
  }
  static uint64_t bytes_for(const PoolGeometry& g) {
    return FlatPool(g, nullptr, kernels::MemoryKind::kHost, "").bytes();
  }
  const PoolGeometry& geometry() const override { return geometry_; }
  const std::string& name() const override { return name_; }
  uint64_t bytes() const override { return bytes_; }
  kernels::MemoryKind memory_kind() const override { return kind_; }
  int cuda_device() const override { return kind_ == kernels::MemoryKind::kCuda ? 0 : -1; }
  std::vector<std::span<std::byte>> host_memory() const override {
    if (kind_ != kernels::MemoryKind::kHost) return {};
    return {std::span<std::byte>(base_, bytes_)};
  }
  std::byte* tensor(uint32_t layer, PoolTensor t) const override {
    if (layer >= geometry_.total_layers() ||
        static_cast<uint32_t>(t) >= geometry_.tensors_per_layer())
      return nullptr;
    return base_ + offsets_[layer * geometry_.tensors_per_layer() + static_cast<uint32_t>(t)];
  }
  Status check_intact() const override { return {}; }
  bool truncated() const override { return false; }

 private:
  PoolGeometry geometry_;
  std::byte* base_;
  kernels::MemoryKind kind_;
  std::string name_;
  std::vector<uint64_t> offsets_;
  uint64_t bytes_ = 0;
};

// A pool "in GPU memory" (see the top of this file), and its host mirror.
class FakeDevicePool {
 public:
  FakeDevicePool(const PoolGeometry& g, const std::string& name)
      : device_(std::make_shared<FakeDevice>(FlatPool::bytes_for(g))),
        pool_(g, device_->device(), kernels::MemoryKind::kCuda, name),
        mirror_(g, device_->mirror(), kernels::MemoryKind::kHost, name + " (mirror)") {}
  const worker::LocalPool& pool() const { return pool_; }
  const worker::LocalPool& mirror() const { return mirror_; }
  const std::shared_ptr<FakeDevice>& device() const { return device_; }

 private:
  std::shared_ptr<FakeDevice> device_;
  FlatPool pool_;
  FlatPool mirror_;
};

// What a FakeDeviceEngine did, and how it misbehaves; shared with the test.
struct FakeEngineControl {
  std::chrono::microseconds delay{2000};  // before a waited-on batch's copies run
  uint64_t fail_from_batch = UINT64_MAX;  // this batch and every later one fail
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> bytes_to_device{0};
  std::atomic<uint64_t> bytes_to_host{0};
};

class FakeDeviceEngine final : public kernels::CopyEngine {
 public:
  FakeDeviceEngine(std::shared_ptr<FakeDevice> device, std::shared_ptr<FakeEngineControl> control)
      : device_(std::move(device)), control_(std::move(control)) {}
  const char* name() const override { return "fake device"; }
  bool reaches(kernels::MemoryKind) const override { return true; }

  Result<kernels::CopyTicket> submit(std::span<const kernels::TensorCopy> batch) override {
    if (!failure_) return failure_.error();
    Pending p;
    for (const kernels::TensorCopy& c : batch)
      for (const kernels::CopyRun& r : c.runs) {
        const std::byte* src = c.src + r.src_offset;
        std::byte* dst = c.dst + r.dst_offset;
        // Device memory must be said to be device memory, and host memory host.
        if ((c.src_kind == kernels::MemoryKind::kCuda) != device_->holds(src, r.bytes) ||
            (c.dst_kind == kernels::MemoryKind::kCuda) != device_->holds(dst, r.bytes))
          return make_error(Errc::kInvalidArgument, "fake device: a copy names the wrong memory");
        if (c.src_kind == kernels::MemoryKind::kCuda) src = device_->to_mirror(src);
        if (c.dst_kind == kernels::MemoryKind::kCuda) dst = device_->to_mirror(dst);
        (c.dst_kind == kernels::MemoryKind::kCuda ? control_->bytes_to_device
                                                  : control_->bytes_to_host) += r.bytes;
        p.copies.push_back(Copy{src, dst, r.bytes});
      }
    p.fails = ++control_->batches >= control_->fail_from_batch;
    pending_.push_back(std::move(p));
    return ++submitted_;
  }
  bool done(kernels::CopyTicket ticket) override { return ticket <= completed_; }
  Status wait(kernels::CopyTicket ticket) override {
    while (completed_ < ticket && completed_ < pending_.size()) {
      std::this_thread::sleep_for(control_->delay);
      const Pending& p = pending_[completed_++];
      if (p.fails) failure_ = make_error(Errc::kSystem, "fake device: an injected copy fault");
      if (!failure_) continue;
      for (const Copy& c : p.copies)
        std::memcpy(c.dst, c.src, c.bytes);
    }
    return failure_;
  }
  Status failure() const override { return failure_; }

 private:
  struct Copy {
    const std::byte* src;
    std::byte* dst;
    uint64_t bytes;
  };
  struct Pending {
    std::vector<Copy> copies;
    bool fails = false;
  };
  std::shared_ptr<FakeDevice> device_;
  std::shared_ptr<FakeEngineControl> control_;
  std::vector<Pending> pending_;
  kernels::CopyTicket submitted_ = 0, completed_ = 0;
  Status failure_;
};

}  // namespace kvrelay::testing
