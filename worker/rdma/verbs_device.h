// libibverbs behind the rdma seam (queue_pair.h): an RDMA device opened with
// its protection domain, memory regions registered on it, and RC queue pairs
// that implement rdma::QueuePair. Built when KVRELAY_HAVE_RDMA (libibverbs-dev).
//
// RoCE (soft-RoCE included) addresses a peer by GID, InfiniBand by LID; a
// QpEndpoint carries both (the capnp RdmaQpInfo on the control connection).
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "worker/rdma/fabric.h"
#include "worker/rdma/queue_pair.h"

namespace kvrelay::worker::rdma {

struct DeviceOptions {
  std::string name;  // "" : the first device
  uint8_t port = 1;
  int gid_index = 1;  // RoCE v2 over IPv4 is usually 1 (0 is the link-local IPv6 GID)
  uint8_t traffic_class = 0;
};

struct QueuePairOptions {
  uint32_t max_send_wr = 256;
  uint32_t max_recv_wr = 256;
  // Local ACK timeout 4.096 us * 2^timeout, retried retry_count times: how
  // long a dead peer takes to become an error completion.
  uint8_t timeout = 14;
  uint8_t retry_count = 7;
  uint8_t rnr_retry = 7;  // 7: retry for ever while the receiver has posted no receive
};

class VerbsDevice;

// A type-2 memory window: a remote key for one range of a registration,
// bound and invalidated by work requests on one queue pair, and usable only
// by that queue pair's peer. What would scope a peer's writes to its grant
// (docs/transports.md says what it costs).
class MemoryWindow final : public Window {
 public:
  ~MemoryWindow() override;
  MemoryWindow(const MemoryWindow&) = delete;
  MemoryWindow& operator=(const MemoryWindow&) = delete;
  // The rkey of the last bind posted (each bind gets a fresh one).
  uint32_t rkey() const override { return rkey_; }

 private:
  friend class VerbsDevice;
  friend class VerbsQueuePair;
  explicit MemoryWindow(ibv_mw* mw) : mw_(mw), rkey_(mw->rkey) {}
  ibv_mw* mw_;
  uint32_t rkey_;
};

// Memory registered for local reads and remote writes (or, with
// RemoteAccess::kWindowsOnly, for windows bound over it).
class MemoryRegion final : public Registration {
 public:
  ~MemoryRegion() override;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;
  uint32_t lkey() const override { return mr_->lkey; }
  uint32_t rkey() const override { return mr_->rkey; }
  uint64_t address() const { return reinterpret_cast<uint64_t>(mr_->addr); }
  size_t bytes() const { return mr_->length; }

 private:
  friend class VerbsDevice;
  friend class VerbsQueuePair;
  explicit MemoryRegion(ibv_mr* mr) : mr_(mr) {}
  ibv_mr* mr_;
};

// Both completion queues report to one completion channel (event_fd()).
class VerbsQueuePair final : public RcQueuePair {
 public:
  ~VerbsQueuePair() override;
  VerbsQueuePair(const VerbsQueuePair&) = delete;
  VerbsQueuePair& operator=(const VerbsQueuePair&) = delete;

  // This side's address, for the peer.
  const QpEndpoint& local() const override { return local_; }
  // INIT -> RTR -> RTS towards `remote`.
  Status connect(const QpEndpoint& remote) override;
  int event_fd() const override { return channel_->fd; }
  Status arm() override;

  Result<size_t> post_writes(std::span<const WriteRequest> writes) override;
  // `window` and `region`: a MemoryWindow and a MemoryRegion of this
  // queue pair's device (the only kinds a VerbsFabric makes).
  Status post_bind(Window& window, const Registration& region, uint64_t address, uint64_t bytes,
                   uint64_t wr_id, bool signaled) override;
  Status post_invalidate(uint32_t rkey, uint64_t wr_id, bool signaled) override;
  Status post_receive(uint64_t wr_id) override;
  size_t poll_send(std::span<WorkCompletion> out) override;
  size_t poll_receive(std::span<WorkCompletion> out) override;
  uint32_t max_send_wr() const override { return max_send_wr_; }
  std::string name() const override { return name_; }

 private:
  friend class VerbsDevice;
  VerbsQueuePair() = default;
  size_t poll(ibv_cq* cq, std::span<WorkCompletion> out);

  const VerbsDevice* device_ = nullptr;
  QueuePairOptions options_;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* send_cq_ = nullptr;
  ibv_cq* recv_cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  unsigned unacked_send_ = 0, unacked_recv_ = 0;  // completion events taken, not yet acknowledged
  uint32_t max_send_wr_ = 0;
  QpEndpoint local_;
  std::string name_;
};

class VerbsDevice {
 public:
  // Opens the device (by name, or the first), its port and GID.
  static Result<std::unique_ptr<VerbsDevice>> open(const DeviceOptions& options);
  ~VerbsDevice();
  VerbsDevice(const VerbsDevice&) = delete;
  VerbsDevice& operator=(const VerbsDevice&) = delete;

  Result<std::unique_ptr<MemoryRegion>> register_memory(
      void* address, size_t bytes, RemoteAccess access = RemoteAccess::kWrite) const;
  // Ok when this device binds type-2 memory windows; else kUnsupported, why.
  Status windows_supported() const;
  Result<std::unique_ptr<MemoryWindow>> allocate_window() const;
  // ibv_reg_dmabuf_mr: GPU memory the NIC reaches through its dma-buf.
  Result<std::unique_ptr<MemoryRegion>> register_dmabuf(
      int fd, uint64_t offset, size_t bytes, uint64_t iova,
      RemoteAccess access = RemoteAccess::kWrite) const;
  Result<std::unique_ptr<VerbsQueuePair>> create_queue_pair(const QueuePairOptions& options) const;

  const std::string& name() const { return name_; }
  const DeviceOptions& options() const { return options_; }
  bool roce() const { return port_.link_layer == IBV_LINK_LAYER_ETHERNET; }
  ibv_mtu active_mtu() const { return port_.active_mtu; }

 private:
  VerbsDevice() = default;

  DeviceOptions options_;
  std::string name_;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_port_attr port_{};
  ibv_gid gid_{};
};

}  // namespace kvrelay::worker::rdma
