// The CUDA copy engine (kernels/copy_engine.h): one non-blocking stream of
// one device, and an event per submitted batch.
//
//   device -> device   the gather kernel (gather_kernel.h), a warp per
//                      64 KiB slice, on at most max_sms SMs
//   host <-> device    pinned and mapped host memory: the same kernel,
//                      through the host memory's device address (zero-copy);
//                      other host memory: cudaMemcpyBatchAsync on the copy
//                      engines, no SMs, every copy reading in stream order
//   host -> host       memcpy at submit (no GPU involved)
//
// Why the kernel for pinned host memory: on an H200 the copy engines moved
// scattered 16 KiB blocks host to device at 4 GB/s in one batch call (7% of
// one large pinned cudaMemcpy), the kernel on 16 SMs at 49 GB/s (89%);
// device to host 17 against 51 GB/s (kvrelay-bench-gpu --only swap). Small
// copies cost the copy engines a descriptor each; a warp per slice does not.
//
// Tickets complete in order (one stream), so done() reaps events from the
// oldest until one is still pending.
#include <fmt/format.h>

#include <cstring>
#include <deque>
#include <unordered_map>
#include <vector>

#include "kernels/copy_engine.h"
#include "kernels/copy_slice.h"
#include "kernels/cuda/gather_kernel.h"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/slice_staging.h"

namespace kvrelay::kernels {

namespace {

class CudaCopyEngine final : public CopyEngine {
 public:
  explicit CudaCopyEngine(const CudaCopyOptions& o)
      : device_(o.device),
        max_blocks_(std::max<uint32_t>(1, o.max_sms) * cuda::kGatherBlocksPerSm) {}

  Status open() {
    if (Status s = cuda::use_device(device_); !s) return s;
    if (Status s = cuda::load_gather_kernels(); !s) return s;
    return cuda::check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                       "cudaStreamCreateWithFlags");
  }

  ~CudaCopyEngine() override {
    if (stream_ == nullptr) return;
    (void)cudaSetDevice(device_);
    // The copies in flight read and write memory their callers free next.
    (void)cudaStreamSynchronize(stream_);
    for (const Pending& p : in_flight_)
      (void)cudaEventDestroy(p.event);
    for (cudaEvent_t e : spare_events_)
      (void)cudaEventDestroy(e);
    (void)cudaStreamDestroy(stream_);
  }

  const char* name() const override {
    return "cuda (gather kernel, batched memcpy for pageable host memory)";
  }
  bool reaches(MemoryKind) const override { return true; }

  Result<CopyTicket> submit(std::span<const TensorCopy> batch) override {
    if (!failure_) return failure_.error();
    if (Status s = cuda::check(cudaSetDevice(device_), "cudaSetDevice"); !s) return s.error();
    slices_.clear();
    dsts_.clear();
    srcs_.clear();
    sizes_.clear();
    for (const TensorCopy& c : batch) {
      const bool src_gpu = c.src_kind == MemoryKind::kCuda;
      const bool dst_gpu = c.dst_kind == MemoryKind::kCuda;
      if (!src_gpu && !dst_gpu) {
        copy_runs_host(c.src, c.dst, c.runs);
      } else if (src_gpu && dst_gpu) {
        append_slices(c.src, c.dst, c.runs, slices_);
      } else if (std::byte* mapped = device_address_of_host(src_gpu ? c.dst : c.src)) {
        if (src_gpu)
          append_slices(c.src, mapped, c.runs, slices_);
        else
          append_slices(mapped, c.dst, c.runs, slices_);
      } else {
        for (const CopyRun& r : c.runs) {
          if (r.bytes == 0) continue;
          dsts_.push_back(c.dst + r.dst_offset);
          srcs_.push_back(c.src + r.src_offset);
          sizes_.push_back(r.bytes);
        }
      }
    }
    if (!slices_.empty())
      if (Status s = cuda::launch_gather(slices_, stream_, max_blocks_, staging_, submitted_ + 1);
          !s)
        return fail(s);
    if (!sizes_.empty())
      if (Status s = copy_batch(); !s) return fail(s);
    cudaEvent_t event = nullptr;
    if (!spare_events_.empty()) {
      event = spare_events_.back();
      spare_events_.pop_back();
    } else if (Status s = cuda::check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                                      "cudaEventCreateWithFlags");
               !s) {
      return fail(s);
    }
    if (Status s = cuda::check(cudaEventRecord(event, stream_), "cudaEventRecord"); !s) {
      spare_events_.push_back(event);
      return fail(s);
    }
    in_flight_.push_back(Pending{++submitted_, event});
    return submitted_;
  }

  bool done(CopyTicket ticket) override {
    reap(false);
    return ticket <= completed_;
  }

  Status wait(CopyTicket ticket) override {
    while (ticket > completed_ && !in_flight_.empty())
      reap(true);
    return failure_;
  }

  Status failure() const override { return failure_; }

 private:
  // The host<->device copies gathered in dsts_/srcs_/sizes_, in one call on
  // the copy engines where the runtime has one. CUDA 13's
  // cudaMemcpyBatchAsync; 12.8 and 12.9 have the same call with a failure
  // index; before 12.8 there is none, and each copy is queued on its own.
  // (Only CUDA 13 is compiled where kvrelay is developed: the 12.x branches
  // follow the 12.8 headers' declaration.)
  Status copy_batch() {
    const std::string what = fmt::format("cudaMemcpyBatchAsync of {} copies", sizes_.size());
#if CUDART_VERSION >= 12080
    cudaMemcpyAttributes attr;
    std::memset(&attr, 0, sizeof(attr));
    // Stream order: a device->host copy must not read the device before
    // the work queued ahead of it on this stream.
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t first_with_attr = 0;
#if CUDART_VERSION >= 13000
    return cuda::check(
        cudaMemcpyBatchAsync(reinterpret_cast<void* const*>(dsts_.data()),
                             reinterpret_cast<const void* const*>(srcs_.data()), sizes_.data(),
                             sizes_.size(), &attr, &first_with_attr, 1, stream_),
        what);
#else
    size_t failed_at = 0;
    Status s = cuda::check(
        cudaMemcpyBatchAsync(reinterpret_cast<void**>(dsts_.data()),
                             const_cast<void**>(reinterpret_cast<const void* const*>(srcs_.data())),
                             sizes_.data(), sizes_.size(), &attr, &first_with_attr, 1, &failed_at,
                             stream_),
        what);
    if (!s) return make_error(s.code(), fmt::format("{} (copy {})", s.error().message, failed_at));
    return {};
#endif
#else
    for (size_t i = 0; i < sizes_.size(); ++i)
      if (Status s = cuda::check(
              cudaMemcpyAsync(dsts_[i], srcs_[i], sizes_[i], cudaMemcpyDefault, stream_),
              fmt::format("cudaMemcpyAsync {} of {}", i, sizes_.size()));
          !s)
        return s;
    return {};
#endif
  }

  // The device address of host memory that is pinned and mapped (the
  // kernel reaches it over the bus), or nullptr for any other host memory
  // (pageable: the copy engines stage it). Asked once per tensor base: a
  // registration outlives the engine that copies from it (worker/
  // data_plane.cpp pins the host tier before it makes the engine).
  std::byte* device_address_of_host(const std::byte* host) {
    auto [it, fresh] = mapped_.try_emplace(host, nullptr);
    if (!fresh) return it->second;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, host) != cudaSuccess) {
      (void)cudaGetLastError();  // pageable memory on old drivers says so by failing
      return nullptr;
    }
    if (a.type == cudaMemoryTypeHost && a.devicePointer != nullptr)
      it->second = static_cast<std::byte*>(a.devicePointer);
    return it->second;
  }

  struct Pending {
    CopyTicket ticket;
    cudaEvent_t event;
  };

  // Ends the oldest batches that have landed; with `block`, waits for the
  // oldest first.
  void reap(bool block) {
    while (!in_flight_.empty()) {
      const Pending& p = in_flight_.front();
      const cudaError_t err = block ? cudaEventSynchronize(p.event) : cudaEventQuery(p.event);
      if (err == cudaErrorNotReady) return;
      if (err != cudaSuccess) {
        // Sticky: the context is broken, and every batch with it.
        failure_ = cuda::check(err, "a queued copy failed");
        completed_ = submitted_;
        return;
      }
      completed_ = p.ticket;
      staging_.release_through(completed_);
      spare_events_.push_back(p.event);
      in_flight_.pop_front();
      block = false;
    }
  }

  Error fail(const Status& s) {
    // A refused call (a bad argument) leaves the stream usable; a fault of
    // the stream's own work does not, and is sticky.
    (void)cudaGetLastError();
    const cudaError_t q = cudaStreamQuery(stream_);
    if (q != cudaSuccess && q != cudaErrorNotReady)
      failure_ = cuda::check(q, "the copy stream failed");
    return s.error();
  }

  int device_;
  uint32_t max_blocks_;
  cudaStream_t stream_ = nullptr;
  CopyTicket submitted_ = 0;
  CopyTicket completed_ = 0;
  std::deque<Pending> in_flight_;
  std::vector<cudaEvent_t> spare_events_;
  Status failure_;
  // Reused per submit: no allocation once warm.
  std::vector<CopySlice> slices_;
  cuda::SliceStaging staging_;  // freed after the destructor has synchronized the stream
  std::unordered_map<const std::byte*, std::byte*> mapped_;  // host tensor base -> device address
  std::vector<std::byte*> dsts_;
  std::vector<const std::byte*> srcs_;
  std::vector<size_t> sizes_;
};

}  // namespace

bool cuda_built_in() {
  return true;
}

Status cuda_device_usable(int device) {
  return cuda::use_device(device);
}

Result<std::unique_ptr<CopyEngine>> make_cuda_copy_engine(const CudaCopyOptions& options) {
  auto engine = std::make_unique<CudaCopyEngine>(options);
  if (Status s = engine->open(); !s) return s.error();
  return std::unique_ptr<CopyEngine>(std::move(engine));
}

}  // namespace kvrelay::kernels
