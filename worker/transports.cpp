#include "worker/transports.h"

#include <fmt/format.h>

#include "schemas/codec.h"

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

Result<std::unique_ptr<Transports>> Transports::create(const InstanceConfig& config,
                                                       uint32_t rank, const LocalPool& local,
                                                       const NetworkOptions& network,
                                                       WaitEvent* doorbell) {
  std::unique_ptr<Transports> t(new Transports(rank, local));
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
  Result<tcp::AuthKey> key = tcp::AuthKey::load(network.auth_key_file);
  if (!key) return key.error();
  t->key_ = std::make_unique<tcp::AuthKey>(std::move(key).value());
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
    receiver.doorbell = doorbell;
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
  if (!receiver_)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("rank {} has no tcp listener (--tcp-ports, --auth-key-file): "
                                  "arrivals are tracked for tcp transfers",
                                  rank_));
  const std::vector<uint32_t> blocks = messages::to_vector(expect.getDestBlockIds());
  return receiver_->arrivals().expect(handle, expect.getRequestId().cStr(), blocks);
}

bool Transports::withdraw(uint64_t handle) {
  return receiver_ && receiver_->arrivals().withdraw(handle);
}

std::vector<tcp::ArrivalEvent> Transports::take_arrivals() {
  if (!receiver_) return {};
  return receiver_->arrivals().take();
}

void Transports::poll(std::vector<TransferCompletion>& out) {
  ipc_.poll(out);
  if (tcp_) tcp_->poll(out);
}

bool Transports::has_completions() const {
  return ipc_.has_completions() || (tcp_ && tcp_->has_completions());
}

}  // namespace kvrelay::worker
