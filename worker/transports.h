// The transports of one worker, chosen per request by the CacheDest's
// protocol (ConnectTask's, for connects): ipc between instances of one host,
// tcp across hosts (worker/tcp/), rdma across hosts over an RDMA device
// (worker/rdma/), when the instance's --protocol names it.
//
// A decode rank also keeps its expected requests (ExpectArrival) here: one
// Arrivals, fed by the tcp listener and by the ipc intake alike. A failed or
// withdrawn expected request is answered only once no ipc writer can still
// be writing under its claim.
//
// With a key file (--auth-key-file) the worker runs a network thread: it
// sends over tcp, and, when its instance gives this rank a tcp port and is
// not prefill-only, it listens there for senders. A port without a key is
// refused: a listener that writes into the KV cache must authenticate.
//
// rdma needs the key too (its control connection is the tcp transport's) and
// an RDMA device. A decode rank accepts rdma sessions on its --rdma-ports
// port, and on its tcp port as well.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "instance/auth_key.h"
#include "instance/instance_config.h"
#include "shm/counters.h"
#include "shm/wait_event.h"
#include "worker/arrivals.h"
#include "worker/ipc_intake.h"
#include "worker/ipc_transport.h"
#include "worker/rdma/fabric.h"
#include "worker/rdma/rdma_transport.h"
#include "worker/tcp/net_thread.h"
#include "worker/tcp/tcp_receiver.h"
#include "worker/tcp/tcp_transport.h"
#include "worker/transport.h"

namespace kvrelay::worker {

struct NetworkOptions {
  std::string listen_address = "127.0.0.1";
  std::string auth_key_file;  // empty: no tcp
  uint32_t lanes = 2;         // parallel connections per decode rank
  // rdma, when the instance accepts it: the device of each rank
  // (--rdma-devices; empty or "auto": the first device), its port, GID
  // index and traffic class, and queue pairs per decode rank.
  std::vector<std::string> rdma_devices;
  uint32_t rdma_port = 1;
  int rdma_gid_index = 1;
  uint32_t rdma_traffic_class = 0;
  uint32_t rdma_queue_pairs = 2;
  // Tests: the fabric to use instead of opening a device.
  std::shared_ptr<rdma::Fabric> rdma_fabric;
  // Not the network's, but set with it: GPU-to-GPU copies (ipc between
  // GPUs, swap within one) run their gather kernel on at most this many SMs
  // (--copy-max-sms).
  uint32_t copy_max_sms = 16;
  // A GPU pool over tcp: each connection stages payloads through two
  // page-locked slots of this many MiB (at least a block).
  uint32_t staging_slot_mib = 8;
};

class Transports final : public Transport {
 public:
  // `doorbell`: rung when a network completion is ready. `control`: the
  // instance's (a decode rank's ipc intake lives there); none in tests.
  static Result<std::unique_ptr<Transports>> create(const InstanceConfig& config, uint32_t rank,
                                                    const LocalPool& local,
                                                    const NetworkOptions& network,
                                                    WaitEvent* doorbell,
                                                    const ControlSegment* control = nullptr);
  ~Transports() override;

  Result<std::shared_ptr<Destination>> resolve(schema::CacheDest::Reader dest) override;
  Status check_connect(schema::ConnectTask::Reader connect) override;
  void poll(std::vector<TransferCompletion>& out) override;
  bool has_completions() const override;

  // The tcp listener, if this rank has one; the rdma one (--rdma-ports).
  const tcp::TcpReceiver* receiver() const { return receiver_.get(); }
  const tcp::TcpReceiver* rdma_receiver() const { return rdma_receiver_.get(); }

  // ExpectArrival: track request `handle`'s writes into its declared blocks
  // (an error when this is not a decode rank, or the blocks are taken).
  Status expect(uint64_t handle, schema::ExpectArrival::Reader expect);
  // A cancel or timeout of an expected request: true when it was one (its
  // answer comes through take_arrivals()).
  [[nodiscard]] bool withdraw(uint64_t handle);
  // Work of every turn: replays what ipc writers say landed here, and sends
  // what this rank's ipc writes landed that waited for room. True when
  // something was done.
  bool tick();
  bool has_arrivals() const;
  std::vector<ArrivalEvent> take_arrivals();
  // Copies what the network transports counted (worker_counters.h) into
  // the rank's counters block; the worker's thread, every turn it mirrors.
  void mirror_counters(CounterWriter& out) const;

 private:
  Transports(uint32_t rank, const LocalPool& local, std::unique_ptr<kernels::CopyEngine> engine,
             const HeadLayout& heads);

  uint32_t rank_;
  IpcTransport ipc_;
  std::shared_ptr<Arrivals> arrivals_;  // decode ranks
  std::unique_ptr<IpcIntake> intake_;   // decode ranks of an instance (not in unit tests)
  std::vector<ArrivalEvent> held_;      // failed or withdrawn, until their claims are settled
  std::unique_ptr<AuthKey> key_;
  std::shared_ptr<rdma::Fabric> fabric_;  // outlives every queue pair
  // The pool on fabric_, registered once for both directions.
  std::shared_ptr<const rdma::RegisteredPool> registered_pool_;
  std::unique_ptr<tcp::NetThread> net_;         // before the users of its thread
  std::unique_ptr<tcp::TcpTransport> tcp_;      // destroyed before the thread
  std::unique_ptr<rdma::RdmaTransport> rdma_;   // destroyed before the thread
  std::unique_ptr<tcp::TcpReceiver> receiver_;  // destroyed before the thread
  std::unique_ptr<tcp::TcpReceiver> rdma_receiver_;
  std::string no_rdma_;  // why rdma is refused, when it is
  std::string no_tcp_;   // why tcp is refused, when it is
};

// The tcp timing from the instance's: heartbeats at its interval, a peer
// silent for most of its peer timeout is gone.
tcp::Timing tcp_timing(const InstanceConfig& config);

}  // namespace kvrelay::worker
