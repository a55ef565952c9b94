#include "worker/transports.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "schemas/codec.h"
#include "worker/net/timing.h"
#include "worker/request_key.h"
#include "worker/worker_counters.h"

namespace kvrelay::worker {

Transports::~Transports() {
  // Listeners first (after them no handler runs), then each row's sending
  // side, then what its handlers shared, then the network threads.
  listeners_.clear();
  for (Row& r : rows_) {
    r.built.counters = nullptr;
    r.built.handlers.clear();
    r.built.sender.reset();
  }
  rows_.clear();
  net_.reset();
}

Result<std::unique_ptr<Transports>> Transports::create(const InstanceConfig& config, uint32_t rank,
                                                       const LocalPool& local,
                                                       const NetworkOptions& network,
                                                       WaitEvent* doorbell,
                                                       const ControlSegment* control,
                                                       std::span<const TransportRow> rows) {
  std::unique_ptr<Transports> t(new Transports(rank));
  const bool decode = config.role == static_cast<uint32_t>(Role::kDecode);
  if (decode) {
    t->arrivals_ = std::make_shared<Arrivals>(local.geometry(), doorbell);
    if (control != nullptr) {
      Result<std::unique_ptr<IpcReceiver>> receiver =
          IpcReceiver::open(*control, rank, local.geometry(), t->arrivals_);
      if (!receiver) return receiver.error();
      t->ipc_receiver_ = std::move(receiver).value();
    }
  }
  TransportContext context{config,  rank,    local,   network, doorbell,
                           control, nullptr, nullptr, nullptr, false};
  context.receives = config.role != static_cast<uint32_t>(Role::kPrefill);
  context.arrivals =
      t->arrivals_ ? t->arrivals_ : std::make_shared<Arrivals>(local.geometry(), doorbell);
  if (network.net.auth_key_file.empty()) {
    for (const TransportRow& row : rows) {
      const uint16_t port = row.listen_port != nullptr ? row.listen_port(config, rank) : 0;
      if (port != 0 && context.receives)
        return make_error(
            Errc::kInvalidArgument,
            fmt::format("rank {} has {} port {} but no --auth-key-file: a listener "
                        "must authenticate its peers (docs/transports.md: Cross-host transfer)",
                        rank, row.name, port));
    }
  } else {
    Result<AuthKey> key = AuthKey::load(network.net.auth_key_file);
    if (!key) return key.error();
    t->key_ = std::make_unique<AuthKey>(std::move(key).value());
    t->net_ = std::make_unique<net::NetThread>(
        // A thread per lane a peer keeps open, between 2 and 8.
        std::clamp<uint32_t>(network.tcp.lanes, 2, 8));
    context.key = t->key_.get();
    context.net = t->net_.get();
  }
  for (const TransportRow& row : rows) {
    Result<BuiltTransport> built = row.build(context);
    if (!built) return built.error();
    t->rows_.push_back(Row{&row, std::move(built).value()});
  }
  if (!context.receives || !t->key_) return t;
  // A listener per port a row names: that row's handlers, and the handlers
  // of the rows that ride along on every listener.
  for (const Row& owner : t->rows_) {
    const uint16_t port =
        owner.row->listen_port != nullptr ? owner.row->listen_port(config, rank) : 0;
    if (port == 0 || owner.built.handlers.empty()) continue;
    net::ListenerOptions o;
    o.address = network.net.listen_address;
    o.port = port;
    o.instance = instance_of(config);
    o.rank = rank;
    o.pool = local.geometry();
    o.heads = head_layout_of(config);
    o.timing = net::timing_of(config);
    o.protection = network.net.protection;
    o.handlers = owner.built.handlers;
    for (const Row& other : t->rows_) {
      if (&other == &owner || !other.row->rides_along) continue;
      for (net::HandlerFactory f : other.built.handlers) {
        f.at_handshake = false;  // only on its own port
        o.handlers.push_back(std::move(f));
      }
    }
    Result<std::unique_ptr<net::Listener>> l = net::Listener::start(*t->net_, *t->key_, o);
    if (!l) return make_error(l.code(), fmt::format("{}: {}", owner.row->name, l.error().message));
    t->ports_.emplace_back(owner.row->name, (*l)->port());
    t->listeners_.push_back(std::move(l).value());
  }
  return t;
}

const Transports::Row* Transports::row_of(schema::TransferProtocol protocol) const {
  for (const Row& r : rows_)
    if (r.row->protocol == protocol) return &r;
  return nullptr;
}

Transport* Transports::find(std::string_view name) const {
  for (const Row& r : rows_)
    if (name == r.row->name) return r.built.sender.get();
  return nullptr;
}

std::string Transports::why_not(std::string_view name) const {
  for (const Row& r : rows_)
    if (name == r.row->name) return r.built.unavailable;
  return fmt::format("no transport is called '{}'", name);
}

uint16_t Transports::listening_port(std::string_view row) const {
  for (const auto& [name, port] : ports_)
    if (name == row) return port;
  return 0;
}

Result<std::shared_ptr<Destination>> Transports::resolve(schema::CacheDest::Reader dest) {
  const Row* r = row_of(dest.getProtocol());
  if (r == nullptr) return make_error(Errc::kInvalidArgument, "unknown protocol");
  if (!r->built.sender) return make_error(Errc::kUnsupported, r->built.unavailable);
  return r->built.sender->resolve(dest);
}

Status Transports::check_connect(schema::ConnectTask::Reader connect) {
  const Row* r = row_of(connect.getProtocol());
  if (r == nullptr) return make_error(Errc::kInvalidArgument, "unknown protocol");
  if (!r->built.sender) return make_error(Errc::kUnsupported, r->built.unavailable);
  return r->built.sender->check_connect(connect);
}

Status Transports::expect(uint64_t handle, schema::ExpectArrival::Reader expect) {
  if (!arrivals_)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("rank {} is not a decode rank: only a decode instance "
                                  "receives transfers",
                                  rank_));
  const std::string id = expect.getRequestId().cStr();
  const std::vector<uint32_t> blocks = messages::to_vector(expect.getDestBlockIds());
  const uint64_t nonce = expect.getRequestNonce();
  if (ipc_receiver_) {
    if (Status s = ipc_receiver_->expect(handle, request_key(id, nonce), blocks); !s) return s;
  }
  Status s = arrivals_->expect(handle, id, blocks, expect.getFromInstance().cStr(), nonce);
  if (!s && ipc_receiver_) {
    ipc_receiver_->close(handle);
    ipc_receiver_->forget(handle);  // refused: nothing of it is answered later
  }
  return s;
}

bool Transports::withdraw(uint64_t handle) {
  if (!arrivals_ || !arrivals_->expects(handle)) return false;
  if (ipc_receiver_) ipc_receiver_->close(handle);  // refused by ipc writers from now on
  return arrivals_->withdraw(handle);
}

bool Transports::tick() {
  bool busy = false;
  if (ipc_receiver_) busy = ipc_receiver_->drain() > 0;
  for (Row& r : rows_)
    if (r.built.sender) busy = r.built.sender->tick() || busy;
  return busy;
}

void Transports::set_landed_hop_observer(std::function<void(uint64_t ns)> observer) {
  if (ipc_receiver_) ipc_receiver_->set_hop_observer(std::move(observer));
}

bool Transports::has_arrivals() const {
  if (!arrivals_) return false;
  if (arrivals_->any() || (ipc_receiver_ && ipc_receiver_->readable())) return true;
  return std::any_of(held_.begin(), held_.end(),
                     [&](const ArrivalEvent& e) { return ipc_receiver_->settled(e.handle); });
}

std::vector<ArrivalEvent> Transports::take_arrivals() {
  if (!arrivals_) return {};
  std::vector<ArrivalEvent> ready;
  std::vector<ArrivalEvent> events = std::exchange(held_, {});
  for (ArrivalEvent& e : arrivals_->take()) {
    if (ipc_receiver_) ipc_receiver_->close(e.handle);
    events.push_back(std::move(e));
  }
  for (ArrivalEvent& e : events) {
    // An arrived request's writers have all said they are done; a failed or
    // withdrawn one may still have writes of ipc writers in progress.
    if (e.kind == ArrivalEvent::kArrived || !ipc_receiver_ || ipc_receiver_->settled(e.handle)) {
      if (ipc_receiver_) ipc_receiver_->forget(e.handle);
      ready.push_back(std::move(e));
    } else {
      held_.push_back(std::move(e));
    }
  }
  return ready;
}

void Transports::poll(std::vector<TransferCompletion>& out) {
  for (Row& r : rows_)
    if (r.built.sender) r.built.sender->poll(out);
}

bool Transports::has_completions() const {
  for (const Row& r : rows_)
    if (r.built.sender && r.built.sender->has_completions()) return true;
  return false;
}

void Transports::mirror_counters(CounterWriter& out) const {
  for (const Row& r : rows_)
    if (r.built.counters) r.built.counters(out);
  // Every listener speaks the same handshake: their counts add up.
  uint64_t accepted = 0, refused = 0;
  for (const auto& l : listeners_) {
    accepted += l->stats().accepted.load(std::memory_order_relaxed);
    refused += l->stats().refused.load(std::memory_order_relaxed);
  }
  out.set(kNetConnectionsAccepted, accepted);
  out.set(kNetConnectionsRefused, refused);
}

}  // namespace kvrelay::worker
