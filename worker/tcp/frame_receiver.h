// The tcp transport's half of a listener (net/listener.h): on each
// connection that carries tcp frames, read each frame's payload straight
// into the pool and ack a transfer once its last payload is there. A pool in
// GPU memory is written through staging slots instead (staging.h): a
// payload is read into a slot, copied host->device, and counts (arrivals,
// the transfer's ack) once the copy has ended.
//
// A frame that fails its checks (frame_wire.h, check_frame, and the rank's
// expected requests) is not written: its payload is read and dropped, its
// transfer is refused once with the reason (the sender fails that request
// only), and the rest of the transfer is dropped too. A peer that keeps
// refused transfers open, or does not read its acks, is closed: its tables
// and queues stay bounded. Refusals are logged at a bounded rate.
//
// An admitted payload must keep arriving: one that has not landed within
// the peer timeout plus a second per MiB is abandoned with its connection,
// so no peer can hold a withdrawal of its request (or the rank) hostage by
// trickling bytes.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>

#include "worker/arrivals.h"
#include "worker/local_pool.h"
#include "worker/net/handler.h"
#include "worker/tcp/staging.h"

namespace kvrelay::worker::tcp {

struct FrameReceiverOptions {
  uint32_t rank = 0;
  const LocalPool* pool = nullptr;
  // The rank's expected requests, which the ipc receiver feeds too.
  std::shared_ptr<Arrivals> arrivals;
  // A pool in GPU memory: payloads land in staging slots and are copied
  // host->device before they count (staging.h). None: its frames are refused.
  std::shared_ptr<Stager> stager;
  // How long an admitted payload may take, beyond a second per MiB.
  std::chrono::milliseconds payload_grace{800};
};

struct FrameStats {
  std::atomic<uint64_t> frames{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> refused_frames{0};
};

// The handler factory a listener serves tcp frames with. `at_handshake`: a
// connection's staging slots are made with the handshake (a tcp listener,
// whose connections all carry frames), not with its first frame.
net::HandlerFactory frame_receiver(FrameReceiverOptions options, std::shared_ptr<FrameStats> stats,
                                   bool at_handshake);

}  // namespace kvrelay::worker::tcp
