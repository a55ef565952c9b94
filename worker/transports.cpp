#include "worker/transports.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>

#include "schemas/codec.h"
#include "worker/request_key.h"
#include "worker/worker_counters.h"

namespace kvrelay::worker {

tcp::Timing tcp_timing(const InstanceConfig& config) {
  tcp::Timing t;
  t.heartbeat = std::chrono::milliseconds(config.heartbeat_interval_ms);
  const uint32_t silence = std::max(3 * config.heartbeat_interval_ms,
                                    config.peer_timeout_ms - 2 * config.heartbeat_interval_ms);
  t.peer_timeout = std::chrono::milliseconds(std::min(silence, config.peer_timeout_ms));
  return t;
}

Transports::Transports(uint32_t rank, const LocalPool& local,
                       std::unique_ptr<kernels::CopyEngine> engine, const HeadLayout& heads)
    : rank_(rank), ipc_(rank, local, std::move(engine), heads) {}

Transports::~Transports() {
  rdma_receiver_.reset();
  receiver_.reset();
  rdma_.reset();
  tcp_.reset();
  net_.reset();
}

namespace {

// The rank's fabric, or why there is none.
Result<std::shared_ptr<rdma::Fabric>> open_fabric(const InstanceConfig& config, uint32_t rank,
                                                  const NetworkOptions& network) {
  if (network.rdma_fabric) return network.rdma_fabric;
  rdma::FabricOptions o;
  if (!network.rdma_devices.empty()) {
    if (network.rdma_devices.size() != 1 && network.rdma_devices.size() != config.tp_size)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("--rdma-devices names {} devices for {} ranks (one for all, "
                                    "or one per rank)",
                                    network.rdma_devices.size(), config.tp_size));
    o.device =
        network.rdma_devices.size() == 1 ? network.rdma_devices[0] : network.rdma_devices[rank];
    if (o.device == "auto") o.device.clear();
  }
  o.port = static_cast<uint8_t>(network.rdma_port);
  o.gid_index = network.rdma_gid_index;
  o.traffic_class = static_cast<uint8_t>(network.rdma_traffic_class);
  Result<std::unique_ptr<rdma::Fabric>> f = rdma::open_verbs_fabric(o);
  if (!f) return f.error();
  return std::shared_ptr<rdma::Fabric>(std::move(f).value());
}

// Staging for a GPU pool's tcp payloads: a copy engine of the pool's GPU
// (host<->device on the copy engines, its own stream).
Result<std::shared_ptr<tcp::Stager>> make_stager(const LocalPool& local,
                                                 const NetworkOptions& network) {
  Result<std::unique_ptr<kernels::CopyEngine>> engine = kernels::make_copy_engine(
      local.memory_kind(), kernels::MemoryKind::kHost,
      kernels::CudaCopyOptions{local.cuda_device(), network.copy_max_sms});
  if (!engine) return engine.error();
  tcp::Stager::Options o;
  o.slot_bytes = uint64_t{network.staging_slot_mib} << 20;
  o.device = local.cuda_device();
  return std::make_shared<tcp::Stager>(std::move(engine).value(), local.memory_kind(), o);
}

}  // namespace

Result<std::unique_ptr<Transports>> Transports::create(const InstanceConfig& config, uint32_t rank,
                                                       const LocalPool& local,
                                                       const NetworkOptions& network,
                                                       WaitEvent* doorbell,
                                                       const ControlSegment* control) {
  // ipc copies from this pool into a peer's of the same kind: memcpy between
  // host pools, the CUDA engine on the pool's GPU otherwise.
  Result<std::unique_ptr<kernels::CopyEngine>> engine = kernels::make_copy_engine(
      local.memory_kind(), local.memory_kind(),
      kernels::CudaCopyOptions{local.cuda_device(), network.copy_max_sms});
  if (!engine) return engine.error();
  std::unique_ptr<Transports> t(
      new Transports(rank, local, std::move(engine).value(), head_layout_of(config)));
  const bool decode = config.role == static_cast<uint32_t>(Role::kDecode);
  if (decode) {
    t->arrivals_ = std::make_shared<Arrivals>(local.geometry(), doorbell);
    if (control != nullptr) {
      Result<std::unique_ptr<IpcIntake>> intake =
          IpcIntake::open(*control, rank, local.geometry(), t->arrivals_);
      if (!intake) return intake.error();
      t->intake_ = std::move(intake).value();
    }
  }
  const bool receives = config.role != static_cast<uint32_t>(Role::kPrefill);
  const uint16_t port = rank < kMaxTpSize ? config.tcp_ports[rank] : 0;
  const uint16_t rdma_port = rank < kMaxTpSize ? config.rdma_ports[rank] : 0;
  const bool listens = port != 0 && receives;
  // A pool in GPU memory goes over tcp through pinned staging slots, a
  // stager (and its own stream) per direction; over rdma, the NIC reaches it
  // directly (GPUDirect RDMA: registered_pool.h).
  std::shared_ptr<tcp::Stager> send_stager, receive_stager;
  const bool gpu_pool = local.memory_kind() != kernels::MemoryKind::kHost;
  const bool wants_rdma = (config.protocols & 4U) != 0;
  if (gpu_pool) {
    Result<std::shared_ptr<tcp::Stager>> sending = make_stager(local, network);
    Result<std::shared_ptr<tcp::Stager>> receiving =
        sending ? make_stager(local, network) : sending;
    if (!sending || !receiving) {
      t->no_tcp_ = fmt::format("rank {} cannot stage its GPU pool for tcp: {}", rank,
                               (sending ? receiving : sending).error().message);
      if (listens) spdlog::warn("rank {}: not listening on its tcp port: {}", rank, t->no_tcp_);
      return t;
    }
    send_stager = std::move(sending).value();
    receive_stager = std::move(receiving).value();
  }
  if (network.auth_key_file.empty()) {
    if (listens || (rdma_port != 0 && receives))
      return make_error(Errc::kInvalidArgument,
                        fmt::format("rank {} has {} port {} but no --auth-key-file: a listener "
                                    "must authenticate its peers (README: Cross-host transfer)",
                                    rank, listens ? "tcp" : "rdma", listens ? port : rdma_port));
    t->no_rdma_ = wants_rdma ? "rdma transfers need a pre-shared key for their control "
                               "connection: start this instance with --auth-key-file (README: "
                               "Cross-host transfer)"
                             : "this instance does not accept rdma: add rdma to its --protocol";
    return t;
  }
  if (wants_rdma) {
    Result<std::shared_ptr<rdma::Fabric>> fabric = open_fabric(config, rank, network);
    if (!fabric) {
      // Not fatal: ipc and tcp still work, and every rdma request says why not.
      t->no_rdma_ = fmt::format("rank {} has no RDMA device: {}", rank, fabric.error().message);
      spdlog::warn("{}", t->no_rdma_);
    } else {
      // Registered here, on the worker's thread, not by the first session on
      // the net thread: pinning a pool of tens of GiB takes seconds, and the
      // net thread's heartbeats (every peer's) would stop meanwhile.
      Result<std::unique_ptr<rdma::RegisteredPool>> registered =
          rdma::RegisteredPool::create(*fabric.value(), local);
      if (!registered) {
        t->no_rdma_ = fmt::format("rank {} cannot register its pool on {} for rdma: {}", rank,
                                  fabric.value()->name(), registered.error().message);
        spdlog::warn("{}", t->no_rdma_);
      } else {
        t->fabric_ = std::move(fabric).value();
        t->registered_pool_ = std::move(registered).value();
        spdlog::info(
            "rank {}: rdma on {}, pool registered ({} registrations, {} of them "
            "dma-bufs of GPU memory)",
            rank, t->fabric_->name(), t->registered_pool_->registrations(),
            t->registered_pool_->dmabuf_registrations());
      }
    }
  } else {
    t->no_rdma_ = "this instance does not accept rdma: add rdma to its --protocol";
  }
  Result<AuthKey> key = AuthKey::load(network.auth_key_file);
  if (!key) return key.error();
  t->key_ = std::make_unique<AuthKey>(std::move(key).value());
  t->net_ = std::make_unique<tcp::NetThread>(std::clamp<uint32_t>(network.lanes, 2, 8));
  tcp::SenderOptions sender;
  sender.instance = instance_of(config);
  sender.rank = rank;
  sender.tp_size = config.tp_size;
  sender.total_kv_heads = head_layout_of(config).total_heads;
  sender.lanes = std::clamp<uint32_t>(network.lanes, 1, 8);
  sender.timing = tcp_timing(config);
  sender.stager = send_stager;
  t->tcp_ = std::make_unique<tcp::TcpTransport>(*t->net_, local, t->key_.get(), sender, doorbell);
  rdma::RdmaSenderOptions rdma_sender;
  rdma_sender.instance = sender.instance;
  rdma_sender.rank = rank;
  rdma_sender.tp_size = config.tp_size;
  rdma_sender.total_kv_heads = sender.total_kv_heads;
  rdma_sender.queue_pairs = std::clamp<uint32_t>(network.rdma_queue_pairs, 1, 16);
  rdma_sender.timing = sender.timing;
  t->rdma_ = std::make_unique<rdma::RdmaTransport>(*t->net_, local, t->key_.get(), t->fabric_.get(),
                                                   t->no_rdma_, rdma_sender, doorbell,
                                                   t->registered_pool_);
  if (receives && (listens || (rdma_port != 0 && wants_rdma))) {
    tcp::ReceiverOptions receiver;
    receiver.address = network.listen_address;
    receiver.instance = instance_of(config);
    receiver.rank = rank;
    receiver.heads = head_layout_of(config);
    receiver.timing = sender.timing;
    receiver.stager = receive_stager;
    receiver.arrivals =
        t->arrivals_ ? t->arrivals_ : std::make_shared<Arrivals>(local.geometry(), doorbell);
    if (t->fabric_)
      receiver.rdma = std::make_shared<rdma::RdmaListener>(t->fabric_.get(), "", local, rank,
                                                           t->registered_pool_);
    if (listens) {
      receiver.port = port;
      receiver.stage_at_handshake = true;
      Result<std::unique_ptr<tcp::TcpReceiver>> r =
          tcp::TcpReceiver::start(*t->net_, local, *t->key_, receiver);
      if (!r) return r.error();
      t->receiver_ = std::move(r).value();
    }
    if (rdma_port != 0 && wants_rdma) {
      receiver.port = rdma_port;
      receiver.stage_at_handshake = false;
      Result<std::unique_ptr<tcp::TcpReceiver>> r =
          tcp::TcpReceiver::start(*t->net_, local, *t->key_, receiver);
      if (!r) return r.error();
      t->rdma_receiver_ = std::move(r).value();
    }
  }
  return t;
}

Result<std::shared_ptr<Destination>> Transports::resolve(schema::CacheDest::Reader dest) {
  switch (dest.getProtocol()) {
    case schema::TransferProtocol::IPC: return ipc_.resolve(dest);
    case schema::TransferProtocol::TCP:
      if (!no_tcp_.empty()) return make_error(Errc::kUnsupported, no_tcp_);
      if (!tcp_)
        return make_error(Errc::kInvalidArgument,
                          "tcp transfers need a pre-shared key: start this instance with "
                          "--auth-key-file (README: Cross-host transfer)");
      return tcp_->resolve(dest);
    case schema::TransferProtocol::RDMA:
      if (!rdma_) return make_error(Errc::kInvalidArgument, no_rdma_);
      return rdma_->resolve(dest);
  }
  return make_error(Errc::kInvalidArgument, "unknown protocol");
}

Status Transports::check_connect(schema::ConnectTask::Reader connect) {
  switch (connect.getProtocol()) {
    case schema::TransferProtocol::IPC: return ipc_.check_connect(connect);
    case schema::TransferProtocol::TCP:
      if (!no_tcp_.empty()) return make_error(Errc::kUnsupported, no_tcp_);
      if (!tcp_)
        return make_error(Errc::kInvalidArgument,
                          "tcp connects need a pre-shared key: start this instance with "
                          "--auth-key-file (README: Cross-host transfer)");
      return tcp_->check_connect(connect);
    case schema::TransferProtocol::RDMA:
      if (!rdma_) return make_error(Errc::kInvalidArgument, no_rdma_);
      return rdma_->check_connect(connect);
  }
  return make_error(Errc::kInvalidArgument, "unknown protocol");
}

Status Transports::expect(uint64_t handle, schema::ExpectArrival::Reader expect) {
  if (!arrivals_)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("rank {} is not a decode rank: only a decode instance "
                                  "receives transfers",
                                  rank_));
  const std::string id = expect.getRequestId().cStr();
  const std::vector<uint32_t> blocks = messages::to_vector(expect.getDestBlockIds());
  if (intake_) {
    if (Status s = intake_->expect(handle, request_key(id), blocks); !s) return s;
  }
  Status s = arrivals_->expect(handle, id, blocks);
  if (!s && intake_) {
    intake_->close(handle);
    intake_->forget(handle);  // refused: nothing of it is answered later
  }
  return s;
}

bool Transports::withdraw(uint64_t handle) {
  if (!arrivals_ || !arrivals_->expects(handle)) return false;
  if (intake_) intake_->close(handle);  // refused by ipc writers from now on
  return arrivals_->withdraw(handle);
}

bool Transports::tick() {
  bool busy = false;
  if (intake_) busy = intake_->drain() > 0;
  ipc_.flush_intake();
  ipc_.release_stale();
  return busy;
}

bool Transports::has_arrivals() const {
  if (!arrivals_) return false;
  if (arrivals_->any() || (intake_ && intake_->readable())) return true;
  return std::any_of(held_.begin(), held_.end(),
                     [&](const ArrivalEvent& e) { return intake_->settled(e.handle); });
}

std::vector<ArrivalEvent> Transports::take_arrivals() {
  if (!arrivals_) return {};
  std::vector<ArrivalEvent> ready;
  std::vector<ArrivalEvent> events = std::exchange(held_, {});
  for (ArrivalEvent& e : arrivals_->take()) {
    if (intake_) intake_->close(e.handle);
    events.push_back(std::move(e));
  }
  for (ArrivalEvent& e : events) {
    // An arrived request's writers have all said they are done; a failed or
    // withdrawn one may still have writes of ipc writers in progress.
    if (e.kind == ArrivalEvent::kArrived || !intake_ || intake_->settled(e.handle)) {
      if (intake_) intake_->forget(e.handle);
      ready.push_back(std::move(e));
    } else {
      held_.push_back(std::move(e));
    }
  }
  return ready;
}

void Transports::poll(std::vector<TransferCompletion>& out) {
  ipc_.poll(out);
  if (tcp_) tcp_->poll(out);
  if (rdma_) rdma_->poll(out);
}

void Transports::mirror_counters(CounterWriter& out) const {
  const auto load = [](const std::atomic<uint64_t>& v) {
    return v.load(std::memory_order_relaxed);
  };
  if (tcp_) {
    out.set(kTcpLanesOpened, load(tcp_->link_stats().opened));
    out.set(kTcpLanesLost, load(tcp_->link_stats().lost));
    out.set(kTcpConnectFailures, load(tcp_->link_stats().unreachable));
  }
  if (rdma_) {
    out.set(kRdmaSessionsOpened, load(rdma_->link_stats().opened));
    out.set(kRdmaSessionsLost, load(rdma_->link_stats().lost));
    out.set(kRdmaConnectFailures, load(rdma_->link_stats().unreachable));
  }
  // Both listeners speak the same protocol (an rdma session is set up over
  // a tcp control connection, on either): their counts add up.
  std::array<uint64_t, kWorkerCounterCount> sum{};
  for (const tcp::TcpReceiver* r : {receiver_.get(), rdma_receiver_.get()}) {
    if (r == nullptr) continue;
    const tcp::ReceiverStats& s = r->stats();
    sum[kNetConnectionsAccepted] += load(s.accepted);
    sum[kNetConnectionsRefused] += load(s.refused);
    sum[kTcpFramesReceived] += load(s.frames);
    sum[kTcpBytesReceived] += load(s.bytes);
    sum[kTcpFramesRefused] += load(s.refused_frames);
    sum[kRdmaSessionsAccepted] += load(s.rdma_sessions);
    sum[kRdmaTransfersReceived] += load(s.rdma_transfers);
    sum[kRdmaIntentsRefused] += load(s.rdma_refused);
  }
  for (uint32_t id = kNetConnectionsAccepted; id <= kRdmaIntentsRefused; ++id)
    out.set(id, sum[id]);
}

bool Transports::has_completions() const {
  return ipc_.has_completions() || (tcp_ && tcp_->has_completions()) ||
         (rdma_ && rdma_->has_completions());
}

}  // namespace kvrelay::worker
