#include "worker/transports.h"

#include <fmt/format.h>

#include "worker/tcp_probe.h"

namespace kvrelay::worker {

Transports::Transports(uint32_t rank, const LocalPool& local)
    : rank_(rank), ipc_(rank, local, kernels::make_host_copy_engine()) {}

Result<std::shared_ptr<Destination>> Transports::resolve(schema::CacheDest::Reader dest) {
  switch (dest.getProtocol()) {
    case schema::TransferProtocol::IPC: return ipc_.resolve(dest);
    case schema::TransferProtocol::TCP:
    case schema::TransferProtocol::RDMA:
      return make_error(
          Errc::kInvalidArgument,
          fmt::format("protocol {} is not available in this build: only ipc between "
                      "instances on one host moves data so far",
                      dest.getProtocol() == schema::TransferProtocol::TCP ? "tcp" : "rdma"));
  }
  return make_error(Errc::kInvalidArgument, "unknown protocol");
}

Status Transports::check_connect(schema::ConnectTask::Reader connect) {
  if (connect.getProtocol() == schema::TransferProtocol::IPC) return ipc_.check_connect(connect);
  const auto ports = connect.getPorts();
  if (rank_ >= ports.size())
    return make_error(Errc::kInvalidArgument, fmt::format("no port for rank {}", rank_));
  return tcp_probe(connect.getPeerAddress().cStr(), ports[rank_], std::chrono::seconds(2));
}

}  // namespace kvrelay::worker
