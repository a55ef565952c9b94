// The copy engine: moves byte runs between tensors, asynchronously. The ipc
// transport and the swap engine both copy through one (DESIGN.md section 6),
// so a new kind of memory needs a new engine and nothing else.
//
// Submit-then-complete: submit() starts every copy of a batch and returns a
// ticket at once; done() says whether the batch has landed, wait() blocks
// until it has. Tickets complete in submission order. The host engine
// copies inside submit() (copy_runs_host), so its tickets are done on return; the
// CUDA engine (kernels/cuda/) queues the batch on its stream and answers
// done() from an event.
//
// Failures: submit() refuses a batch it cannot start (nothing of it was
// queued). A copy that fails once queued (a CUDA fault) is sticky, as CUDA
// errors are: failure() says so from then on, and every ticket that was in
// flight or comes later must be taken as failed. The worker then exits and
// is restarted with a fresh CUDA context.
//
// An engine is used by one thread at a time; each user (the send path, the
// swap thread) owns its own.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "kernels/block_copy.h"
#include "shm/result.h"

namespace kvrelay::kernels {

// Where a tensor's bytes live. An engine refuses memory it cannot reach.
enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };

const char* memory_kind_name(MemoryKind kind);

// One tensor's share of a batch: `runs` from `src` to `dst`.
struct TensorCopy {
  const std::byte* src;
  std::byte* dst;
  std::span<const CopyRun> runs;
  MemoryKind src_kind = MemoryKind::kHost;
  MemoryKind dst_kind = MemoryKind::kHost;
  // The destination is read next by this host's CPUs (a swap load into a
  // host-memory device pool, which the engine reads at once): the host
  // engine keeps it in the cache instead of streaming past it.
  bool read_soon = false;
};

using CopyTicket = uint64_t;

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual const char* name() const = 0;
  // Whether this engine can read and write memory of `kind`.
  virtual bool reaches(MemoryKind kind) const = 0;
  // Starts every copy of `batch`; the spans must stay valid until done().
  virtual Result<CopyTicket> submit(std::span<const TensorCopy> batch) = 0;
  // Whether the ticket's copies have ended (landed, or failed: see failure()).
  virtual bool done(CopyTicket ticket) = 0;
  // Blocks until the ticket's copies have ended; their outcome.
  virtual Status wait(CopyTicket ticket) = 0;
  // Ok until a queued copy failed; from then on, why (sticky).
  virtual Status failure() const = 0;
};

// copy_runs_host on the calling thread: every ticket is done when submit() returns.
std::unique_ptr<CopyEngine> make_host_copy_engine();

// The CUDA engine's settings.
struct CudaCopyOptions {
  int device = 0;  // the GPU whose stream the copies run on
  // Device-to-device copies, and host<->device copies of pinned, mapped
  // host memory, run in a gather kernel on at most this many SMs (the rest
  // stay the model's). Other host<->device copies use the copy engines
  // (cudaMemcpyBatchAsync) and no SMs.
  uint32_t max_sms = 16;
};

// Whether this build has the CUDA engine at all.
bool cuda_built_in();

// Ok when CUDA device `device` can be used here; else why not (kUnsupported:
// no CUDA in this build, no driver, no GPU; kInvalidArgument: no such device).
Status cuda_device_usable(int device);

// A CUDA engine on its own non-blocking stream of `options.device`.
Result<std::unique_ptr<CopyEngine>> make_cuda_copy_engine(const CudaCopyOptions& options);

// The engine for copies from `src` memory to `dst` memory: the host copy when both
// are host memory, else the CUDA engine (kUnsupported where there is none).
Result<std::unique_ptr<CopyEngine>> make_copy_engine(MemoryKind src, MemoryKind dst,
                                                     const CudaCopyOptions& options);

}  // namespace kvrelay::kernels
