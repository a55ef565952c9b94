// The rdma transport's seam over verbs: the few calls of an RC queue pair
// that the posting logic uses (post a chain of RDMA WRITEs, post a receive
// for a notification, poll completions). verbs_device.h implements it with
// libibverbs; the unit tests implement it with memcpy (fake_queue_pair.h in
// tests/worker/), so that the posting logic can be driven through a full
// send queue, error completions and resets without a device.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "shm/result.h"

namespace kvrelay::worker::rdma {

// What a peer needs to connect to a queue pair (the capnp RdmaQpInfo;
// endpoint_codec.h checks what a peer sends).
struct QpEndpoint {
  uint16_t lid = 0;               // InfiniBand
  uint32_t qpn = 0;               // 24 bits
  uint32_t psn = 0;               // 24 bits
  std::array<uint8_t, 16> gid{};  // RoCE
  uint32_t mtu = 0;               // bytes: 256, 512, 1024, 2048 or 4096
};

// One RDMA WRITE of a contiguous local range into a contiguous remote one.
struct WriteRequest {
  uint64_t wr_id = 0;
  uint64_t local_address = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
  uint64_t remote_address = 0;
  uint32_t rkey = 0;
  // With a value: IBV_WR_RDMA_WRITE_WITH_IMM, which also consumes a receive
  // at the peer and completes there with this immediate.
  std::optional<uint32_t> immediate;
  bool signaled = false;  // a send completion is generated for it
};

// The result of a completed work request (ibv_wc, in the parts used).
struct WorkCompletion {
  uint64_t wr_id = 0;
  bool ok = true;
  std::string status;  // ibv_wc_status_str() when not ok: "remote access error", ...
  // Receive side: the immediate of a WRITE_WITH_IMM that landed.
  std::optional<uint32_t> immediate;
  uint32_t byte_len = 0;
};

class QueuePair {
 public:
  virtual ~QueuePair() = default;

  // Posts `writes` as one chain (ibv_post_send). Returns how many were
  // accepted, in order: all of them, or fewer when the send queue filled
  // (the rest can be posted again once completions free slots). An error
  // means the queue pair cannot take work any more (reset it).
  virtual Result<size_t> post_writes(std::span<const WriteRequest> writes) = 0;
  // Posts a receive for one incoming WRITE_WITH_IMM notification.
  virtual Status post_receive(uint64_t wr_id) = 0;
  // Completions of signaled writes (and of every write once the queue pair
  // failed: they flush with an error), oldest first.
  virtual size_t poll_send(std::span<WorkCompletion> out) = 0;
  // Completions of receives: landed WRITE_WITH_IMM notifications.
  virtual size_t poll_receive(std::span<WorkCompletion> out) = 0;
  // Send-queue slots: at most this many writes may be outstanding.
  virtual uint32_t max_send_wr() const = 0;
  // For messages: "rxe0 qp 0x11".
  virtual std::string name() const = 0;
};

}  // namespace kvrelay::worker::rdma
