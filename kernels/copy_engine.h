// The copy engine: moves byte runs between tensors, asynchronously. The ipc
// transport and the swap engine both copy through one (DESIGN.md section 6),
// so a new kind of memory needs a new engine and nothing else.
//
// Submit-then-complete: submit() starts every copy of a batch and returns a
// ticket at once; done() says whether the batch has landed, wait() blocks
// until it has. The host engine copies inside submit() with memcpy, so its
// tickets are done on return; a CUDA engine (GPU issue) queues the batch on
// a stream and answers done() from an event.
//
// An engine is used by one thread at a time; each user (the send path, the
// swap thread) owns its own.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "kernels/block_copy.h"

namespace kvrelay::kernels {

// Where a tensor's bytes live. An engine refuses memory it cannot reach.
enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };

const char* memory_kind_name(MemoryKind kind);

// One tensor's share of a batch: `runs` from `src` to `dst`.
struct TensorCopy {
  const std::byte* src;
  std::byte* dst;
  std::span<const CopyRun> runs;
};

using CopyTicket = uint64_t;

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual const char* name() const = 0;
  // Whether this engine can read and write memory of `kind`.
  virtual bool reaches(MemoryKind kind) const = 0;
  // Starts every copy of `batch`; the spans must stay valid until done().
  virtual CopyTicket submit(std::span<const TensorCopy> batch) = 0;
  virtual bool done(CopyTicket ticket) = 0;
  virtual void wait(CopyTicket ticket) = 0;
};

// memcpy on the calling thread: every ticket is done when submit() returns.
std::unique_ptr<CopyEngine> make_host_copy_engine();

}  // namespace kvrelay::kernels
