#include "worker/tcp/registration.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "worker/net/timing.h"
#include "worker/tcp/frame_receiver.h"
#include "worker/tcp/staging.h"
#include "worker/tcp/tcp_transport.h"
#include "worker/worker_counters.h"

namespace kvrelay::worker::tcp {

namespace {

// Staging for a GPU pool's tcp payloads: a copy engine of the pool's GPU
// (host<->device on the copy engines, its own stream).
Result<std::shared_ptr<Stager>> make_stager(const LocalPool& local, const NetworkOptions& network) {
  Result<std::unique_ptr<kernels::CopyEngine>> engine = kernels::make_copy_engine(
      local.memory_kind(), kernels::MemoryKind::kHost,
      kernels::CudaCopyOptions{local.cuda_device(), network.copy_max_sms});
  if (!engine) return engine.error();
  Stager::Options o;
  o.slot_bytes = uint64_t{network.tcp.staging_slot_mib} << 20;
  o.device = local.cuda_device();
  return std::make_shared<Stager>(std::move(engine).value(), local.memory_kind(), o);
}

}  // namespace

uint16_t listen_port(const InstanceConfig& config, uint32_t rank) {
  return rank < kMaxTpSize ? config.tcp_ports[rank] : 0;
}

Result<BuiltTransport> build(TransportContext& c) {
  BuiltTransport b;
  if (c.key == nullptr) {
    b.unavailable =
        "tcp transfers need a pre-shared key: start this instance with --auth-key-file "
        "(docs/transports.md: "
        "Cross-host transfer)";
    return b;
  }
  // A pool in GPU memory goes over tcp through pinned staging slots, a
  // stager (and its own stream) per direction.
  std::shared_ptr<Stager> send_stager, receive_stager;
  if (c.local.memory_kind() != kernels::MemoryKind::kHost) {
    Result<std::shared_ptr<Stager>> sending = make_stager(c.local, c.network);
    Result<std::shared_ptr<Stager>> receiving = sending ? make_stager(c.local, c.network) : sending;
    if (!sending || !receiving) {
      b.unavailable = fmt::format("rank {} cannot stage its GPU pool for tcp: {}", c.rank,
                                  (sending ? receiving : sending).error().message);
      if (listen_port(c.config, c.rank) != 0 && c.receives)
        spdlog::warn("rank {}: not listening on its tcp port: {}", c.rank, b.unavailable);
      return b;
    }
    send_stager = std::move(sending).value();
    receive_stager = std::move(receiving).value();
  }
  SenderOptions sender;
  sender.instance = instance_of(c.config);
  sender.rank = c.rank;
  sender.tp_size = c.config.tp_size;
  sender.total_kv_heads = head_layout_of(c.config).total_heads;
  sender.lanes = c.network.tcp.lanes;  // 1-8 (tcp_options.cpp)
  sender.timing = net::timing_of(c.config);
  sender.protection = c.network.net.protection;
  sender.stager = send_stager;
  auto transport = std::make_unique<TcpTransport>(*c.net, c.local, c.key, sender, c.doorbell);
  const TcpTransport* t = transport.get();
  auto frames = std::make_shared<FrameStats>();
  FrameReceiverOptions receiver;
  receiver.rank = c.rank;
  receiver.pool = &c.local;
  receiver.arrivals = c.arrivals;
  receiver.stager = receive_stager;
  receiver.payload_grace = sender.timing.peer_timeout;
  b.handlers.push_back(frame_receiver(receiver, frames, /*at_handshake=*/true));
  b.counters = [t, frames](CounterWriter& out) {
    const auto load = [](const std::atomic<uint64_t>& v) {
      return v.load(std::memory_order_relaxed);
    };
    out.set(kTcpLanesOpened, load(t->link_stats().opened));
    out.set(kTcpLanesLost, load(t->link_stats().lost));
    out.set(kTcpConnectFailures, load(t->link_stats().unreachable));
    out.set(kTcpFramesReceived, load(frames->frames));
    out.set(kTcpBytesReceived, load(frames->bytes));
    out.set(kTcpFramesRefused, load(frames->refused_frames));
  };
  // Copies into a GPU pool queued before the listeners closed end first.
  b.keep = std::shared_ptr<void>(nullptr, [receive_stager](void*) {
    if (receive_stager) receive_stager->drain();
  });
  b.sender = std::move(transport);
  return b;
}

}  // namespace kvrelay::worker::tcp
