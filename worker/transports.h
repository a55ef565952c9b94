// The transports of one worker, built from the registry (transport_registry.h)
// and chosen per request by the CacheDest's protocol (ConnectTask's, for
// connects): ipc between instances of one host, tcp and rdma across hosts.
//
// A decode rank also keeps its expected requests (ExpectArrival) here: one
// Arrivals, fed by the network transports' handlers and by the ipc receiver
// alike. A failed or withdrawn expected request is answered only once no ipc
// writer can still be writing under its claim.
//
// With a key file (--auth-key-file) the worker runs network threads and the
// network rows build their sending sides; a rank that receives (not
// prefill-only) opens a listener on each port a row names for it, serving
// that row's handlers and those of the rows that ride along (an rdma session
// over the tcp port). A port without a key is refused: a listener that
// writes into the KV cache must authenticate.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "instance/auth_key.h"
#include "instance/instance_config.h"
#include "shm/counters.h"
#include "shm/wait_event.h"
#include "worker/arrivals.h"
#include "worker/ipc/ipc_receiver.h"
#include "worker/net/listener.h"
#include "worker/net/net_thread.h"
#include "worker/network_options.h"
#include "worker/transport.h"
#include "worker/transport_registry.h"

namespace kvrelay::worker {

class Transports final : public Transport {
 public:
  // `doorbell`: rung when a network completion is ready. `control`: the
  // instance's (a decode rank's ipc receiver lives there); none in tests.
  // `rows`: the registry (a test adds its own transports).
  static Result<std::unique_ptr<Transports>> create(
      const InstanceConfig& config, uint32_t rank, const LocalPool& local,
      const NetworkOptions& network, WaitEvent* doorbell, const ControlSegment* control = nullptr,
      std::span<const TransportRow> rows = transport_rows());
  ~Transports() override;

  const char* name() const override { return "transports"; }
  Result<std::shared_ptr<Destination>> resolve(schema::CacheDest::Reader dest) override;
  Status check_connect(schema::ConnectTask::Reader connect) override;
  void poll(std::vector<TransferCompletion>& out) override;
  bool has_completions() const override;

  // A row's sending side by name (nullptr: none, or refused: why_not()).
  Transport* find(std::string_view name) const;
  std::string why_not(std::string_view name) const;
  // The listeners this rank opened, and the port of the one a row asked for.
  const std::vector<std::unique_ptr<net::Listener>>& listeners() const { return listeners_; }
  uint16_t listening_port(std::string_view row) const;

  // ExpectArrival: track request `handle`'s writes into its declared blocks
  // (an error when this is not a decode rank, or the blocks are taken).
  Status expect(uint64_t handle, schema::ExpectArrival::Reader expect);
  // A cancel or timeout of an expected request: true when it was one (its
  // answer comes through take_arrivals()).
  [[nodiscard]] bool withdraw(uint64_t handle);
  // Work of every turn: replays what ipc writers say landed here, and each
  // transport's own. True when something was done.
  bool tick() override;
  bool has_arrivals() const;
  // How long each ipc landed record waited to be read (IpcReceiver's hop);
  // nothing on a rank without an ipc receiver.
  void set_landed_hop_observer(std::function<void(uint64_t ns)> observer);
  std::vector<ArrivalEvent> take_arrivals();
  // Copies what the network transports counted (worker_counters.h) into
  // the rank's counters block; the worker's thread, every turn it mirrors.
  void mirror_counters(CounterWriter& out) const;

 private:
  struct Row {
    const TransportRow* row;
    BuiltTransport built;
  };
  Transports(uint32_t rank) : rank_(rank) {}
  const Row* row_of(schema::TransferProtocol protocol) const;

  uint32_t rank_;
  std::shared_ptr<Arrivals> arrivals_;  // decode ranks
  std::unique_ptr<IpcReceiver> ipc_receiver_;   // decode ranks of an instance (not in unit tests)
  std::vector<ArrivalEvent> held_;      // failed or withdrawn, until their claims are settled
  std::unique_ptr<AuthKey> key_;
  std::unique_ptr<net::NetThread> net_;                    // before the users of its threads
  std::vector<Row> rows_;                                  // destroyed before the threads
  std::vector<std::unique_ptr<net::Listener>> listeners_;  // destroyed first
  std::vector<std::pair<std::string, uint16_t>> ports_;    // row name -> its listener's port
};

}  // namespace kvrelay::worker
