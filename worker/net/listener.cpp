#include "worker/net/listener.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <mutex>
#include <unordered_map>

#include "worker/net/server_auth.h"

namespace kvrelay::worker::net {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {
// Out of descriptors: how long accepting pauses, and how often it says so.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
constexpr auto kWarnEvery = std::chrono::seconds(10);
}  // namespace

// What every connection of the listener shares; lives as long as one of them.
struct Listener::Shared {
  Shared(asio::io_context& context, const AuthKey& k, ListenerOptions o,
         std::shared_ptr<ListenerStats> s)
      : io(context),
        acceptor(asio::make_strand(context)),
        backoff(acceptor.get_executor()),
        key(k),
        options(std::move(o)),
        stats(std::move(s)) {}
  asio::io_context& io;
  tcp::acceptor acceptor;  // on a strand of its own, with `connections`, `stopped`, `reserve_fd`
  asio::steady_timer backoff;
  const AuthKey& key;
  ListenerOptions options;
  std::shared_ptr<ListenerStats> stats;
  uint64_t epoch = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count());
  std::vector<std::weak_ptr<Channel>> connections;
  bool stopped = false;
  int reserve_fd = -1;  // given up to accept (and shed) a connection when out of descriptors

  // Connections that have not proved the key yet, in all and by source.
  std::mutex pending_mu;
  uint32_t pending = 0;
  std::unordered_map<std::string, uint32_t> pending_by_source;
  // Rate-limited warnings (any strand), one limit per kind: a flood of
  // refused peers must not hide that the listener ran out of descriptors.
  enum class Warning { kPeer, kAccept, kCount };
  struct WarningLimit {
    std::chrono::steady_clock::time_point warned_at{};
    uint64_t unwarned = 0;
  };
  std::mutex warn_mu;
  std::array<WarningLimit, static_cast<size_t>(Warning::kCount)> warnings{};

  // A new unauthenticated connection from `source`, or why it is shed.
  std::optional<std::string> admit(const std::string& source) {
    std::lock_guard lock(pending_mu);
    if (pending >= options.max_unauthenticated)
      return fmt::format("{} connections are already proving the key", pending);
    uint32_t& mine = pending_by_source[source];
    if (mine >= options.max_unauthenticated_per_source)
      return fmt::format("{} connections from {} are already proving the key", mine, source);
    ++mine;
    ++pending;
    return std::nullopt;
  }
  void release(const std::string& source) {
    std::lock_guard lock(pending_mu);
    --pending;
    auto it = pending_by_source.find(source);
    if (it != pending_by_source.end() && --it->second == 0) pending_by_source.erase(it);
  }
  // Logs at most one warning of a kind every kWarnEvery, saying how many it
  // left out.
  void warn(Warning kind, const std::string& what) {
    std::lock_guard lock(warn_mu);
    WarningLimit& limit = warnings[static_cast<size_t>(kind)];
    const auto now = std::chrono::steady_clock::now();
    if (limit.warned_at != std::chrono::steady_clock::time_point{} &&
        now - limit.warned_at < kWarnEvery) {
      ++limit.unwarned;
      return;
    }
    spdlog::warn("rank {}: {}{}", options.rank, what,
                 limit.unwarned != 0
                     ? fmt::format(" ({} more like it since the last warning)", limit.unwarned)
                     : std::string());
    limit.warned_at = now;
    limit.unwarned = 0;
  }
};

namespace {

class Connection final : public Channel, public ServerLink {
 public:
  Connection(tcp::socket socket, std::string source, std::string peer,
             std::shared_ptr<Listener::Shared> shared)
      : Channel(std::move(socket), shared->options.timing, std::move(peer)),
        shared_(std::move(shared)),
        source_(std::move(source)),
        handshake_(shared_->key, shared_->options.protection),
        deadline_(socket_.get_executor()) {}

  ~Connection() override {
    if (pending_) shared_->release(source_);
  }

  void start() {
    Outgoing challenge;
    handshake_.challenge(challenge.owned);
    Channel::send(std::move(challenge));
    deadline_.expires_after(shared_->options.handshake_timeout);
    deadline_.async_wait([self = self_ptr()](const boost::system::error_code& ec) {
      if (ec || self->serving_) return;
      self->close(fmt::format("did not complete the handshake within {} ms",
                              self->shared_->options.handshake_timeout.count()));
    });
    start_channel();
  }

  // ---- ServerLink ----
  void send(Outgoing message) override { Channel::send(std::move(message)); }
  void read_next() override { Channel::read_next(); }
  void read_payload(std::byte* dst, uint64_t bytes, std::function<void()> then, bool first,
                    bool last) override {
    Channel::read_payload(dst, bytes, std::move(then), first, last);
  }
  void read_scattered(std::span<const iovec> pieces, std::function<void()> then) override {
    Channel::read_scattered(pieces, std::move(then));
  }
  void discard_payload(uint64_t bytes, std::function<void()> then) override {
    Channel::discard_payload(bytes, std::move(then));
  }
  void close(const std::string& reason) override { Channel::close(reason); }
  bool closed() const override { return Channel::closed(); }
  const std::string& peer_name() const override { return Channel::peer_name(); }
  const Hello& hello() const override { return *handshake_.hello(); }
  asio::any_io_executor executor() override { return Channel::executor(); }
  std::shared_ptr<void> keep_alive() override { return shared_from_this(); }
  size_t queued() const override { return Channel::queued(); }

 private:
  std::shared_ptr<Connection> self_ptr() {
    return std::static_pointer_cast<Connection>(Channel::shared_from_this());
  }

  void on_message(Inbound in) override {
    if (refusing_) return;  // nothing more is read from a refused peer
    if (!serving_) return on_handshake(in);
    switch (in.kind) {
      case schema::NetEnvelope::HEARTBEAT: return read_next();
      case schema::NetEnvelope::MESSAGE: {
        MessageHandler* h = handler_for(in.protocol);
        if (h == nullptr) return;  // closed, saying why
        return h->on_message(in);
      }
      default:
        return close(fmt::format("unexpected message (kind {}) after the handshake",
                                 static_cast<int>(in.kind)));
    }
  }

  void on_handshake(const Inbound& in) {
    Result<HandshakeStep> step = handshake_.on_message(in);
    if (!step) return refuse(step.error().message);
    if (!step->send_plain.empty()) {
      Outgoing out;
      out.owned = std::move(step->send_plain);
      Channel::send(std::move(out));
    }
    if (step->start_session)
      start_session(*step->start_session, shared_->options.protection, /*client=*/false);
    if (!step->done) return read_next();
    const Hello& hello = *handshake_.hello();
    const ListenerOptions& o = shared_->options;
    HelloAck ack;
    ack.pool = o.pool;
    ack.epoch = shared_->epoch;
    if (o.heads) {
      ack.tp_size = o.heads->tp_size;
      ack.total_kv_heads = o.heads->total_heads;
    }
    if (Status ok = check_hello(hello, o.instance, o.pool, o.heads); !ok) {
      // The peer proved the key: it may hear why, and this side's shape.
      ack.reason = ok.error().message;
      return refuse(ack.reason, &ack);
    }
    ack.accepted = true;
    for (const HandlerFactory& f : o.handlers)
      if (f.at_handshake) make_handler(f);
    Outgoing reply;
    encode_hello_ack(ack, reply.owned);
    Channel::send(std::move(reply));
    serving_ = true;
    deadline_.cancel();
    if (pending_) {
      pending_ = false;
      shared_->release(source_);
    }
    ++shared_->stats->accepted;
    spdlog::info("rank {}: connection from {} (instance '{}' rank {})", o.rank, peer_name(),
                 hello.instance, hello.rank);
    read_next();
  }

  // Before the key is proved nothing is answered (the peer learns nothing);
  // after, a helloAck says why, and the connection closes once it is written.
  void refuse(const std::string& why, const HelloAck* ack = nullptr) {
    if (refusing_) return;
    refusing_ = true;
    ++shared_->stats->refused;
    shared_->warn(Listener::Shared::Warning::kPeer,
                  fmt::format("connection from {} refused: {}", peer_name(), why));
    if (ack == nullptr) return close(why);
    Outgoing reply;
    encode_hello_ack(*ack, reply.owned);
    reply.written = [self = self_ptr(), why] { self->close(why); };
    Channel::send(std::move(reply));
  }

  MessageHandler* handler_for(uint8_t protocol) {
    for (auto& [p, h] : handlers_)
      if (p == protocol) return h.get();
    for (const HandlerFactory& f : shared_->options.handlers)
      if (f.protocol == protocol) return make_handler(f);
    close(fmt::format("a message of protocol {}, which this listener does not serve",
                      static_cast<int>(protocol)));
    return nullptr;
  }

  MessageHandler* make_handler(const HandlerFactory& f) {
    handlers_.emplace_back(f.protocol, f.make(*this));
    return handlers_.back().second.get();
  }

  void on_closed(const std::string& reason) override {
    deadline_.cancel();
    for (auto& [p, h] : handlers_)
      h->on_closed(reason);
    if (pending_) {
      pending_ = false;
      shared_->release(source_);
    }
    if (serving_) {
      spdlog::info("rank {}: connection from {} closed: {}", shared_->options.rank, peer_name(),
                   reason);
    } else if (!refusing_) {  // gone (or silent) before it was served
      ++shared_->stats->refused;
      shared_->warn(Listener::Shared::Warning::kPeer,
                    fmt::format("connection from {} refused: {}", peer_name(), reason));
    }
  }

  std::shared_ptr<Listener::Shared> shared_;
  std::string source_;
  ServerHandshake handshake_;
  asio::steady_timer deadline_;
  bool pending_ = true;  // counted among the unauthenticated (admitted by accept_next)
  bool serving_ = false;
  bool refusing_ = false;
  std::vector<std::pair<uint8_t, std::unique_ptr<MessageHandler>>> handlers_;
};

void accept_next(const std::shared_ptr<Listener::Shared>& shared);

// Out of descriptors: the pending connection cannot be served. Give up the
// reserve descriptor, take the connection off the queue and close it (so it
// neither waits nor makes accept() fail again at once), keep a reserve
// again, and pause accepting for a moment.
void shed_and_back_off(const std::shared_ptr<Listener::Shared>& shared, const std::string& why) {
  if (shared->reserve_fd >= 0) {
    ::close(shared->reserve_fd);
    shared->reserve_fd = -1;
    const int fd = ::accept4(shared->acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) ::close(fd);
    shared->reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  ++shared->stats->refused;
  ++shared->stats->accept_backoffs;
  shared->warn(Listener::Shared::Warning::kAccept,
               fmt::format("cannot accept connections: {}; shedding them for {} ms", why,
                           kAcceptBackoff.count()));
  shared->backoff.expires_after(kAcceptBackoff);
  shared->backoff.async_wait([shared](const boost::system::error_code& ec) {
    if (!ec && !shared->stopped) accept_next(shared);
  });
}

void accept_next(const std::shared_ptr<Listener::Shared>& shared) {
  // Each connection gets a strand of its own: connections run in parallel.
  shared->acceptor.async_accept(
      asio::make_strand(shared->io),
      [shared](const boost::system::error_code& ec, tcp::socket socket) {
        if (shared->stopped || ec == asio::error::operation_aborted) return;
        if (ec == asio::error::no_descriptors || ec.value() == ENFILE || ec.value() == ENOBUFS ||
            ec.value() == ENOMEM)
          return shed_and_back_off(shared, ec.message());
        if (ec) {
          shared->warn(Listener::Shared::Warning::kAccept,
                       fmt::format("accept failed: {}", ec.message()));
          return accept_next(shared);
        }
        boost::system::error_code ignored;
        const auto remote = socket.remote_endpoint(ignored);
        const std::string source = remote.address().to_string();
        const std::string peer = fmt::format("{}:{}", source, remote.port());
        if (std::optional<std::string> why = shared->admit(source)) {
          ++shared->stats->refused;
          shared->warn(Listener::Shared::Warning::kPeer,
                       fmt::format("connection from {} shed: {}", peer, *why));
          socket.close(ignored);
          return accept_next(shared);
        }
        tune_socket(socket, shared->options.timing.peer_timeout);
        auto c = std::make_shared<Connection>(std::move(socket), source, peer, shared);
        std::erase_if(shared->connections, [](const auto& w) { return w.expired(); });
        shared->connections.push_back(c);
        asio::dispatch(c->Channel::executor(), [c] { c->start(); });
        accept_next(shared);
      });
}

}  // namespace

Result<std::unique_ptr<Listener>> Listener::start(NetThread& net, const AuthKey& key,
                                                  ListenerOptions options) {
  auto stats = std::make_shared<ListenerStats>();
  auto shared = std::make_shared<Shared>(net.io(), key, options, stats);
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(options.address, ec);
  if (ec)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("--listen-address '{}' is not an IP address", options.address));
  const tcp::endpoint endpoint(address, options.port);
  auto& a = shared->acceptor;
  if (a.open(endpoint.protocol(), ec); !ec) a.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return make_error(Errc::kSystem, fmt::format("cannot listen on {}:{}: {}", options.address,
                                                 options.port, ec.message()));
  shared->reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const uint16_t port = a.local_endpoint(ec).port();
  asio::post(shared->acceptor.get_executor(), [shared] { accept_next(shared); });
  std::string serves;
  for (const HandlerFactory& f : options.handlers)
    serves += (serves.empty() ? "" : ", ") + std::string(f.name);
  spdlog::info("rank {}: accepting {} on {}:{} (sessions {})", options.rank, serves,
               options.address, port, protection_name(options.protection));
  return std::unique_ptr<Listener>(new Listener(std::move(shared), std::move(stats), port));
}

Listener::Listener(std::shared_ptr<Shared> shared, std::shared_ptr<ListenerStats> stats,
                   uint16_t port)
    : shared_(std::move(shared)), stats_(std::move(stats)), port_(port) {}

Listener::~Listener() {
  // Stop accepting and close every connection, each on its strand, and wait:
  // after this no handler touches the pool.
  auto closed = std::make_shared<WaitGroup>();
  closed->add(1);
  asio::post(shared_->acceptor.get_executor(), [shared = shared_, closed] {
    shared->stopped = true;
    boost::system::error_code ignored;
    shared->acceptor.close(ignored);
    shared->backoff.cancel();
    if (shared->reserve_fd >= 0) ::close(shared->reserve_fd);
    shared->reserve_fd = -1;
    for (auto& w : shared->connections) {
      if (auto c = w.lock()) {
        closed->add(1);
        c->close_soon("the listener is stopping", [closed] { closed->done(); });
      }
    }
    closed->done();
  });
  closed->wait();
}

}  // namespace kvrelay::worker::net
