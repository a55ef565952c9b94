// The transports of one worker, chosen per request by the CacheDest's
// protocol (ConnectTask's, for connects). ipc moves data between instances
// of one host; tcp and rdma are refused with a reason until their transports
// exist (a tcp ConnectTask still probes the port, as before).
#pragma once

#include <memory>

#include "worker/ipc_transport.h"
#include "worker/transport.h"

namespace kvrelay::worker {

class Transports final : public Transport {
 public:
  Transports(uint32_t rank, const LocalPool& local);

  Result<std::shared_ptr<Destination>> resolve(schema::CacheDest::Reader dest) override;
  Status check_connect(schema::ConnectTask::Reader connect) override;
  void poll(std::vector<TransferCompletion>& out) override { ipc_.poll(out); }
  bool has_completions() const override { return ipc_.has_completions(); }

 private:
  uint32_t rank_;
  IpcTransport ipc_;
};

}  // namespace kvrelay::worker
