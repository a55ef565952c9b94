#include "worker/transport_registry.h"

#include "worker/ipc/registration.h"
#include "worker/rdma/registration.h"
#include "worker/tcp/registration.h"

namespace kvrelay::worker {

namespace {

constexpr TransportRow kRows[] = {
    // protocol                     name    its listener's port   rides along  build
    {schema::TransferProtocol::IPC, "ipc", nullptr, false, &ipc::build},
    {schema::TransferProtocol::TCP, "tcp", &tcp::listen_port, false, &tcp::build},
    {schema::TransferProtocol::RDMA, "rdma", &rdma::listen_port, true, &rdma::build},
};

}  // namespace

std::span<const TransportRow> transport_rows() {
  return kRows;
}

}  // namespace kvrelay::worker
