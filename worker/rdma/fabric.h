// The rdma transport's seam over an RDMA device: register memory, create RC
// queue pairs, connect them, and learn when completions wait. The transport
// (rdma_transport.h) sees only this; verbs_fabric.cpp implements it with
// libibverbs, and the tests with memcpy between queue pairs of one process
// (tests/worker/fake_fabric.h), so that the whole transport runs, under the
// sanitizers too, on a machine without a device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "shm/result.h"
#include "worker/rdma/queue_pair.h"

namespace kvrelay::worker::rdma {

// Who may write a registration remotely: any peer that has its rkey, or
// only through memory windows bound over it (a grant's, rdma_receiver.h).
enum class RemoteAccess { kWrite, kWindowsOnly };

// Memory registered for local reads and remote writes (or, with
// RemoteAccess::kWindowsOnly, for windows bound over it).
class Registration {
 public:
  virtual ~Registration() = default;
  virtual uint32_t lkey() const = 0;
  virtual uint32_t rkey() const = 0;
};

// A type-2 memory window: a remote key for one range of a registration,
// bound and invalidated by work requests on one queue pair, and usable only
// by that queue pair's peer.
class Window {
 public:
  virtual ~Window() = default;
  // The rkey of the last bind posted (each bind makes a fresh one).
  virtual uint32_t rkey() const = 0;
};

// An RC queue pair that is connected to one remote queue pair, with a
// completion event: event_fd() becomes readable when a completion may wait,
// once armed. The pattern: arm(), then poll until empty, then wait for the
// fd, then arm() again (a completion between the poll and the wait still
// makes the fd readable).
class RcQueuePair : public QueuePair {
 public:
  // This side's address, for the peer.
  virtual const QpEndpoint& local() const = 0;
  // To ready-to-send towards `remote`.
  virtual Status connect(const QpEndpoint& remote) = 0;
  virtual int event_fd() const = 0;
  // Consumes the events that made the fd readable and asks for the next.
  virtual Status arm() = 0;
  // Binds `window` over [address, address + bytes) of `region` (a
  // kWindowsOnly registration of the same fabric) for remote writes by this
  // queue pair's peer; window.rkey() is the new key from here on. Completes
  // on the send queue, in order with the queue pair's other sends, and takes
  // a send-queue slot until then.
  virtual Status post_bind(Window& window, const Registration& region, uint64_t address,
                           uint64_t bytes, uint64_t wr_id, bool signaled) = 0;
  // Invalidates the window whose current key is `rkey`: writes with it fail
  // once this completes (a local invalidation, on the send queue).
  virtual Status post_invalidate(uint32_t rkey, uint64_t wr_id, bool signaled) = 0;
};

class Fabric {
 public:
  virtual ~Fabric() = default;
  virtual Result<std::unique_ptr<Registration>> register_memory(void* address, size_t bytes,
                                                                RemoteAccess access) = 0;
  // GPU memory exported as a dma-buf (kernels/dmabuf.h): `bytes` from
  // `offset` into dma-buf `fd`, addressed in work requests as [iova, iova +
  // bytes) (the memory's device addresses, so that a pool's tensor addresses
  // serve as they are). The fd may be closed once this returns.
  virtual Result<std::unique_ptr<Registration>> register_dmabuf(int fd, uint64_t offset,
                                                                size_t bytes, uint64_t iova,
                                                                RemoteAccess access) = 0;
  // Ok where the device binds type-2 memory windows; else why not.
  virtual Status windows_supported() const = 0;
  virtual Result<std::unique_ptr<Window>> allocate_window() = 0;
  virtual Result<std::unique_ptr<RcQueuePair>> create_queue_pair() = 0;
  // For messages: "rxe0 port 1".
  virtual const std::string& name() const = 0;
};

struct FabricOptions {
  std::string device;  // "" : the first one ibv_devices lists
  uint8_t port = 1;
  int gid_index = 1;  // RoCE: which GID; 1 is RoCE v2 over IPv4 on most setups
  uint8_t traffic_class = 0;
  uint32_t max_send_wr = 256;
  uint32_t max_recv_wr = 256;
  uint8_t timeout = 14;  // local ACK timeout 4.096 us * 2^timeout (about 67 ms)
  uint8_t retry_count = 7;
};

// The device named in `options`, through libibverbs; an error that says what
// is missing in a build without rdma-core or on a host without a device.
Result<std::unique_ptr<Fabric>> open_verbs_fabric(const FabricOptions& options);

}  // namespace kvrelay::worker::rdma
