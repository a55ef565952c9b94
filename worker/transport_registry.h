// The transports a worker knows, one row each: the registry is the list,
// and adding a transport is a folder of its own plus one row here (as a
// transport in NCCL is a file plus a line of ncclTransports[]). Transports
// (transports.h) builds every row once per data plane, routes each request
// to the row its protocol names, and opens the listeners the rows ask for.
//
// A row builds its sending side (a Transport), says why requests of its
// protocol are refused where it cannot serve them, hands the listener the
// message handlers its receiving side needs (net/handler.h), and copies its
// counters into the rank's block. What its sending and receiving sides
// share (an RDMA fabric, staging for a GPU pool) stays inside the row.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "instance/auth_key.h"
#include "instance/control_segment.h"
#include "instance/instance_config.h"
#include "schemas/kvrelay.capnp.h"
#include "shm/counters.h"
#include "shm/wait_event.h"
#include "worker/arrivals.h"
#include "worker/local_pool.h"
#include "worker/net/handler.h"
#include "worker/net/net_thread.h"
#include "worker/network_options.h"
#include "worker/transport.h"

namespace kvrelay::worker {

// What a row builds from.
struct TransportContext {
  const InstanceConfig& config;
  uint32_t rank;
  const LocalPool& local;
  const NetworkOptions& network;
  WaitEvent* doorbell;            // rung when a completion is ready
  const ControlSegment* control;  // the instance's; none in unit tests
  // The network's, when this rank has a key (--auth-key-file); null otherwise.
  const AuthKey* key = nullptr;
  net::NetThread* net = nullptr;
  // The rank's expected requests: a decode rank's, else a private one.
  std::shared_ptr<Arrivals> arrivals;
  bool receives = false;  // not prefill-only: listeners may be opened
};

struct BuiltTransport {
  std::unique_ptr<Transport> sender;  // null: requests of this protocol are refused
  std::string unavailable;            // ...with this reason
  // Handlers for listeners: on the row's own port, and (rides_along) on
  // the other rows' ports too.
  std::vector<net::HandlerFactory> handlers;
  // Copies its counters into the rank's block (worker_counters.h).
  std::function<void(CounterWriter&)> counters;
  // What its handlers use; released after every listener is gone.
  std::shared_ptr<void> keep;
};

struct TransportRow {
  schema::TransferProtocol protocol;
  const char* name;
  // The port this row listens on for `rank` (0: none of its own).
  uint16_t (*listen_port)(const InstanceConfig& config, uint32_t rank);
  // Its handlers also serve the listeners of other rows' ports (an rdma
  // session set up over a tcp listener's connection).
  bool rides_along;
  Result<BuiltTransport> (*build)(TransportContext& context);
};

// Every transport of this build.
std::span<const TransportRow> transport_rows();

}  // namespace kvrelay::worker
