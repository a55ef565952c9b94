#include "worker/rdma/registration.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "worker/net/timing.h"
#include "worker/rdma/fabric.h"
#include "worker/rdma/rdma_transport.h"
#include "worker/rdma/registered_pool.h"
#include "worker/rdma/session_handler.h"
#include "worker/worker_counters.h"

namespace kvrelay::worker::rdma {

namespace {

bool wanted(const InstanceConfig& config) {
  return (config.protocols & kProtocolRdma) != 0;
}

// The rank's fabric, or why there is none.
Result<std::shared_ptr<Fabric>> open_fabric(const InstanceConfig& config, uint32_t rank,
                                            const NetworkOptions& network) {
  const RdmaOptions& rdma = network.rdma;
  if (rdma.fabric) return rdma.fabric;
  // rdma_options.cpp checked the list's length against the instance.
  if (rdma.devices.size() > 1 && rdma.devices.size() != config.tp_size)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("--rdma-devices names {} devices for {} ranks (one for all, "
                                  "or one per rank)",
                                  rdma.devices.size(), config.tp_size));
  FabricOptions o;
  o.device = rdma.device_of(rank);
  o.port = static_cast<uint8_t>(rdma.port);
  o.gid_index = static_cast<int>(rdma.gid_index);
  o.traffic_class = static_cast<uint8_t>(rdma.traffic_class);
  Result<std::unique_ptr<Fabric>> f = open_verbs_fabric(o);
  if (!f) return f.error();
  return std::shared_ptr<Fabric>(std::move(f).value());
}

// What the sender and the listeners' sessions share, kept until both are gone.
struct Resources {
  std::shared_ptr<Fabric> fabric;  // outlives every queue pair
  std::shared_ptr<const RegisteredPool> registered;
};

}  // namespace

uint16_t listen_port(const InstanceConfig& config, uint32_t rank) {
  return wanted(config) && rank < kMaxTpSize ? config.rdma_ports[rank] : 0;
}

Result<BuiltTransport> build(TransportContext& c) {
  BuiltTransport b;
  if (!wanted(c.config)) {
    b.unavailable = "this instance does not accept rdma: add rdma to its --protocol";
  } else if (c.key == nullptr) {
    b.unavailable =
        "rdma transfers need a pre-shared key for their control connection: start this instance "
        "with --auth-key-file (docs/transports.md: Cross-host transfer)";
    return b;
  }
  auto res = std::make_shared<Resources>();
  if (b.unavailable.empty()) {
    Result<std::shared_ptr<Fabric>> fabric = open_fabric(c.config, c.rank, c.network);
    if (!fabric) {
      // Not fatal: ipc and tcp still work, and every rdma request says why not.
      b.unavailable =
          fmt::format("rank {} has no usable RDMA device: {}", c.rank, fabric.error().message);
      spdlog::warn("{}", b.unavailable);
    } else {
      // Registered here, on the worker's thread, not by the first session on
      // a network thread: pinning a pool of tens of GiB takes seconds, and
      // that thread's heartbeats (every peer's) would stop meanwhile.
      Result<std::unique_ptr<RegisteredPool>> registered =
          RegisteredPool::create(*fabric.value(), c.local);
      if (!registered) {
        b.unavailable = fmt::format("rank {} cannot register its pool on {} for rdma: {}", c.rank,
                                    fabric.value()->name(), registered.error().message);
        spdlog::warn("{}", b.unavailable);
      } else {
        res->fabric = std::move(fabric).value();
        res->registered = std::move(registered).value();
        spdlog::info(
            "rank {}: rdma on {}, pool registered ({} registrations, {} of them dma-bufs of GPU "
            "memory)",
            c.rank, res->fabric->name(), res->registered->registrations(),
            res->registered->dmabuf_registrations());
        // What a peer holding the net key may write (docs/transports.md, Trust).
        if (res->registered->windows())
          spdlog::info("rank {}: rdma peers write through memory windows bound per grant",
                       c.rank);
        else
          spdlog::warn(
              "rank {}: {} has no memory windows ({}): every authenticated rdma peer may write "
              "anywhere in the pool; use tcp between hosts that do not trust each other",
              c.rank, res->fabric->name(), res->fabric->windows_supported().error().message);
      }
    }
  }
  if (c.key == nullptr) return b;  // no listener either: nothing more to offer
  auto sessions = std::make_shared<SessionStats>();
  std::shared_ptr<RdmaListener> listener;
  if (res->fabric)
    listener =
        std::make_shared<RdmaListener>(res->fabric.get(), "", c.local, c.rank, res->registered);
  // Offers are answered even where rdma cannot be served: with the reason.
  b.handlers.push_back(
      session_handler(listener,
                      b.unavailable.empty()
                          ? std::string()
                          : fmt::format("rank {} does not accept rdma: {}", c.rank, b.unavailable),
                      c.arrivals, c.rank, sessions, net::timing_of(c.config).peer_timeout));
  RdmaSenderOptions o;
  o.instance = instance_of(c.config);
  o.rank = c.rank;
  o.tp_size = c.config.tp_size;
  o.total_kv_heads = head_layout_of(c.config).total_heads;
  o.queue_pairs = c.network.rdma.queue_pairs;  // 1-16 (rdma_options.cpp)
  o.timing = net::timing_of(c.config);
  o.protection = c.network.net.protection;
  if (res->fabric) {
    auto transport = std::make_unique<RdmaTransport>(*c.net, c.local, c.key, res->fabric.get(), "",
                                                     o, c.doorbell, res->registered);
    const RdmaTransport* t = transport.get();
    b.counters = [t, sessions](CounterWriter& out) {
      const auto load = [](const std::atomic<uint64_t>& v) {
        return v.load(std::memory_order_relaxed);
      };
      out.set(kRdmaSessionsOpened, load(t->link_stats().opened));
      out.set(kRdmaSessionsLost, load(t->link_stats().lost));
      out.set(kRdmaConnectFailures, load(t->link_stats().unreachable));
      out.set(kRdmaSessionsAccepted, load(sessions->sessions));
      out.set(kRdmaTransfersReceived, load(sessions->transfers));
      out.set(kRdmaIntentsRefused, load(sessions->refused));
    };
    b.sender = std::move(transport);
  } else {
    b.counters = [sessions](CounterWriter& out) {
      out.set(kRdmaIntentsRefused, sessions->refused.load(std::memory_order_relaxed));
    };
  }
  b.keep = res;
  return b;
}

}  // namespace kvrelay::worker::rdma
