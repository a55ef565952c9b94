#include "worker/transports.h"

#include <fmt/format.h>

#include "schemas/codec.h"
#include "worker/request_key.h"

namespace kvrelay::worker {

tcp::Timing tcp_timing(const InstanceConfig& config) {
  tcp::Timing t;
  t.heartbeat = std::chrono::milliseconds(config.heartbeat_interval_ms);
  const uint32_t silence = std::max(3 * config.heartbeat_interval_ms,
                                    config.peer_timeout_ms - 2 * config.heartbeat_interval_ms);
  t.peer_timeout = std::chrono::milliseconds(std::min(silence, config.peer_timeout_ms));
  return t;
}

Transports::Transports(uint32_t rank, const LocalPool& local)
    : rank_(rank), ipc_(rank, local, kernels::make_host_copy_engine()) {}

Transports::~Transports() {
  receiver_.reset();
  tcp_.reset();
  net_.reset();
}

Result<std::unique_ptr<Transports>> Transports::create(const InstanceConfig& config, uint32_t rank,
                                                       const LocalPool& local,
                                                       const NetworkOptions& network,
                                                       WaitEvent* doorbell,
                                                       const ControlSegment* control) {
  std::unique_ptr<Transports> t(new Transports(rank, local));
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
  const uint16_t port = rank < kMaxTpSize ? config.tcp_ports[rank] : 0;
  const bool listens = port != 0 && config.role != static_cast<uint32_t>(Role::kPrefill);
  if (network.auth_key_file.empty()) {
    if (listens)
      return make_error(Errc::kInvalidArgument,
                        fmt::format("rank {} has tcp port {} but no --auth-key-file: a tcp "
                                    "listener must authenticate its peers (README: Cross-host "
                                    "transfer)",
                                    rank, port));
    return t;
  }
  Result<AuthKey> key = AuthKey::load(network.auth_key_file);
  if (!key) return key.error();
  t->key_ = std::make_unique<AuthKey>(std::move(key).value());
  t->net_ = std::make_unique<tcp::NetThread>(std::clamp<uint32_t>(network.lanes, 2, 8));
  tcp::SenderOptions sender;
  sender.instance = instance_of(config);
  sender.rank = rank;
  sender.tp_size = config.tp_size;
  sender.lanes = std::clamp<uint32_t>(network.lanes, 1, 8);
  sender.timing = tcp_timing(config);
  t->tcp_ = std::make_unique<tcp::TcpTransport>(*t->net_, local, t->key_.get(), sender, doorbell);
  if (listens) {
    tcp::ReceiverOptions receiver;
    receiver.address = network.listen_address;
    receiver.port = port;
    receiver.instance = instance_of(config);
    receiver.rank = rank;
    receiver.timing = sender.timing;
    receiver.arrivals =
        t->arrivals_ ? t->arrivals_ : std::make_shared<Arrivals>(local.geometry(), doorbell);
    Result<std::unique_ptr<tcp::TcpReceiver>> r =
        tcp::TcpReceiver::start(*t->net_, local, *t->key_, receiver);
    if (!r) return r.error();
    t->receiver_ = std::move(r).value();
  }
  return t;
}

Result<std::shared_ptr<Destination>> Transports::resolve(schema::CacheDest::Reader dest) {
  switch (dest.getProtocol()) {
    case schema::TransferProtocol::IPC: return ipc_.resolve(dest);
    case schema::TransferProtocol::TCP:
      if (!tcp_)
        return make_error(Errc::kInvalidArgument,
                          "tcp transfers need a pre-shared key: start this instance with "
                          "--auth-key-file (README: Cross-host transfer)");
      return tcp_->resolve(dest);
    case schema::TransferProtocol::RDMA:
      return make_error(Errc::kInvalidArgument,
                        "protocol rdma is not available in this build: use ipc on one host or "
                        "tcp across hosts");
  }
  return make_error(Errc::kInvalidArgument, "unknown protocol");
}

Status Transports::check_connect(schema::ConnectTask::Reader connect) {
  switch (connect.getProtocol()) {
    case schema::TransferProtocol::IPC: return ipc_.check_connect(connect);
    case schema::TransferProtocol::TCP:
      if (!tcp_)
        return make_error(Errc::kInvalidArgument,
                          "tcp connects need a pre-shared key: start this instance with "
                          "--auth-key-file (README: Cross-host transfer)");
      return tcp_->check_connect(connect);
    case schema::TransferProtocol::RDMA:
      return make_error(Errc::kInvalidArgument,
                        "protocol rdma is not available in this build: use ipc on one host or "
                        "tcp across hosts");
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
}

bool Transports::has_completions() const {
  return ipc_.has_completions() || (tcp_ && tcp_->has_completions());
}

}  // namespace kvrelay::worker
