#include "worker/rdma/session_handler.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <boost/asio/steady_timer.hpp>
#include <optional>

#include "worker/rdma/completion_watch.h"
#include "worker/rdma/control_wire.h"

namespace kvrelay::worker::rdma {

namespace {

// How often a session with granted transfers is looked at.
constexpr auto kWatchEvery = std::chrono::milliseconds(100);

struct Shared {
  std::chrono::milliseconds grace{800};
  std::shared_ptr<RdmaListener> listener;
  std::string why_not;
  std::shared_ptr<Arrivals> arrivals;
  uint32_t rank = 0;
  std::shared_ptr<SessionStats> stats;
};

class SessionHandler final : public net::MessageHandler {
 public:
  SessionHandler(net::ServerLink& link, std::shared_ptr<Shared> shared)
      : link_(link), shared_(std::move(shared)), overdue_(link.executor()) {}

  void on_message(const net::Inbound& in) override {
    Result<Message> m = decode(in);
    if (!m) return link_.close(m.error().message);
    switch (m->kind) {
      case Message::Kind::kOffer: return on_offer(m->offer);
      case Message::Kind::kIntent: return on_intent(m->intent);
      default: return link_.close("an rdma message only a receiver sends, sent to a receiver");
    }
  }

  void on_closed(const std::string&) override {
    overdue_.cancel();
    if (watch_) watch_->stop();
    session_.reset();  // its queue pairs first: then what it granted and did not land is abandoned
  }

 private:
  void on_offer(const std::vector<QpEndpoint>& offer) {
    if (session_) return link_.close("a second rdma offer on one connection");
    net::Outgoing reply;
    const PoolGeometry& g =
        shared_->listener ? shared_->listener->pool().geometry() : PoolGeometry{};
    Result<std::unique_ptr<RdmaSession>> session =
        shared_->listener ? RdmaSession::accept(*shared_->listener, *shared_->arrivals, offer,
                                                link_.peer_name(), link_.hello().instance)
                          : Result<std::unique_ptr<RdmaSession>>(
                                make_error(Errc::kInvalidArgument, shared_->why_not));
    if (!session) {
      spdlog::warn("rank {}: rdma offer from {} refused: {}", shared_->rank, link_.peer_name(),
                   session.error().message);
      encode_accept(false, session.error().message, {}, g, {}, reply.owned);
      link_.send(std::move(reply));
      return link_.read_next();
    }
    session_ = std::move(session).value();
    ++shared_->stats->sessions;
    const std::vector<QpEndpoint> mine = session_->endpoints();
    encode_accept(true, "", mine, g, session_->registration().tensors(), reply.owned);
    link_.send(std::move(reply));
    spdlog::info("rank {}: rdma session with {} over {} queue pairs", shared_->rank,
                 link_.peer_name(), mine.size());
    watch_.emplace(link_.executor());
    watch_->start(session_->event_fds(), [this] { on_completions(); });
    on_completions();  // arms the queue pairs
    if (!link_.closed()) link_.read_next();
  }

  void on_intent(const Intent& part) {
    if (!session_) return link_.close("an rdma intent before an rdma session");
    Result<std::optional<std::vector<Grant>>> grant = session_->on_intent(part);
    if (!grant) return link_.close(grant.error().message);
    if (*grant) send_grants(**grant);
    // A grant whose windows are being bound can still be overdue for its
    // request's withdrawal.
    if (session_->open_transfers() != 0 && !watching_) watch_grants();
    link_.read_next();
  }

  // Grant parts (and refusals), in one message.
  void send_grants(std::vector<Grant>& grants) {
    if (shared_->listener && shared_->listener->tamper_grants)
      shared_->listener->tamper_grants(grants);
    net::Outgoing reply;
    for (const Grant& g : grants) {
      if (!g.ok) ++shared_->stats->refused;
      encode_grant(g, reply.owned);
    }
    link_.send(std::move(reply));
  }

  // While grants are open: a withdrawn request's, or one whose writes do
  // not land in time, ends the session (its queue pairs go, and what it was
  // granted is abandoned): see RdmaSession::overdue.
  void watch_grants() {
    watching_ = true;
    overdue_.expires_after(kWatchEvery);
    overdue_.async_wait([this, keep = link_.keep_alive()](const boost::system::error_code& ec) {
      watching_ = false;
      if (ec || link_.closed() || !session_) return;
      if (std::optional<std::string> why = session_->overdue(shared_->grace)) {
        // Once per session at most: the sender sees only the connection
        // close, so this rank's log is where the reason is.
        spdlog::warn("rank {}: ending the rdma session with {}: {}", shared_->rank,
                     link_.peer_name(), *why);
        return link_.close(*why);
      }
      if (session_->open_transfers() != 0) watch_grants();
    });
  }

  void on_completions() {
    if (!session_ || link_.closed()) return;
    acks_.clear();
    grants_.clear();
    Status s = session_->poll(acks_, grants_);
    if (!grants_.empty()) {
      send_grants(grants_);
      if (!watching_) watch_grants();
    }
    if (!acks_.empty()) {
      net::Outgoing out;
      for (const Ack& a : acks_)
        encode_ack(a.transfer, a.status.ok(), a.status ? "" : a.status.error().message, out.owned);
      shared_->stats->transfers += acks_.size();
      link_.send(std::move(out));
    }
    if (!s) link_.close(s.error().message);
  }

  net::ServerLink& link_;
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<RdmaSession> session_;  // once the peer offered one
  boost::asio::steady_timer overdue_;
  bool watching_ = false;
  std::optional<CompletionWatch> watch_;
  std::vector<Ack> acks_;      // scratch
  std::vector<Grant> grants_;  // scratch
};

}  // namespace

net::HandlerFactory session_handler(std::shared_ptr<RdmaListener> listener, std::string why_not,
                                    std::shared_ptr<Arrivals> arrivals, uint32_t rank,
                                    std::shared_ptr<SessionStats> stats,
                                    std::chrono::milliseconds grace) {
  auto shared = std::make_shared<Shared>();
  shared->grace = grace;
  shared->listener = std::move(listener);
  shared->why_not = std::move(why_not);
  shared->arrivals = std::move(arrivals);
  shared->rank = rank;
  shared->stats = std::move(stats);
  net::HandlerFactory f;
  f.protocol = kProtocol;
  f.name = "rdma sessions";
  f.make = [shared](net::ServerLink& link) -> std::unique_ptr<net::MessageHandler> {
    return std::make_unique<SessionHandler>(link, shared);
  };
  return f;
}

}  // namespace kvrelay::worker::rdma
