#include "worker/fd_socket_server.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "shm/clock.h"

namespace kvrelay::worker {

namespace {

constexpr auto kConnectionDeadline = std::chrono::seconds(2);
// At most this many sets of fds wait for their RegisterPool at once: an
// engine that passes fds and never registers cannot exhaust the worker's
// descriptors.
constexpr size_t kMaxUnclaimed = 16;

uint64_t fresh_ticket() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  uint64_t t = 0;
  while (t == 0)
    t = rng();
  return t;
}

void reply(int connection, Errc code, std::string_view message, uint64_t ticket = 0,
           std::span<const std::byte> payload = {}, std::span<const int> fds = {}) {
  FdReply h{};
  h.magic = kFdSocketMagic;
  h.code = static_cast<uint32_t>(code);
  h.ticket = ticket;
  h.count = static_cast<uint32_t>(fds.size());
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  std::memcpy(h.message, message.data(), std::min(message.size(), kFdReplyMessageBytes - 1));
  std::vector<std::byte> bytes(sizeof(h) + payload.size());
  std::memcpy(bytes.data(), &h, sizeof(h));
  if (!payload.empty()) std::memcpy(bytes.data() + sizeof(h), payload.data(), payload.size());
  if (Status s = send_fd_message(connection, bytes, fds); !s)
    spdlog::warn("fd socket: {}", s.error().message);
}

}  // namespace

Result<std::unique_ptr<FdSocketServer>> FdSocketServer::start(std::string_view instance, uint32_t rank) {
  UniqueFd sock(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!sock.valid()) return system_error("socket(AF_UNIX)", errno);
  Result<FdSocketAddress> a = fd_socket_address(instance, rank);
  if (!a) return a.error();
  if (bind(sock.get(), reinterpret_cast<const sockaddr*>(&a->addr), a->len) != 0)
    return system_error(fmt::format("binding rank {}'s fd socket @{}", rank,
                                    fd_socket_name(instance, rank).substr(1)),
                        errno);
  if (listen(sock.get(), 16) != 0) return system_error("listen on the fd socket", errno);
  UniqueFd stop(eventfd(0, EFD_CLOEXEC));
  if (!stop.valid()) return system_error("eventfd", errno);
  return std::unique_ptr<FdSocketServer>(new FdSocketServer(std::move(sock), std::move(stop), rank));
}

FdSocketServer::FdSocketServer(UniqueFd listener, UniqueFd stop, uint32_t rank)
    : listener_(std::move(listener)),
      stop_(std::move(stop)),
      rank_(rank),
      thread_([this] { serve(); }) {}

FdSocketServer::~FdSocketServer() {
  const uint64_t one = 1;
  if (write(stop_.get(), &one, sizeof(one)) != sizeof(one)) std::abort();
  thread_.join();
}

void FdSocketServer::serve() {
  for (;;) {
    pollfd p[2] = {{listener_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    const int ready = poll(p, 2, 1000);
    if (p[1].revents != 0) return;
    expire(mono_now_ns());
    if (ready <= 0 || p[0].revents == 0) continue;
    UniqueFd connection(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!connection.valid()) continue;
    answer(connection.get());
  }
}

void FdSocketServer::answer(int connection) {
  ucred peer{};
  socklen_t peer_len = sizeof(peer);
  if (getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0 ||
      peer.uid != geteuid()) {
    spdlog::warn("rank {}: fd socket: refused pid {} of uid {} (not this worker's user)", rank_,
                 peer.pid, peer.uid);
    reply(connection, Errc::kPermissionDenied,
          "only processes of the worker's own user are served");
    return;
  }
  Result<FdMessage> request = receive_fd_message(connection, sizeof(FdRequest), kMaxPassedFds,
                                                 Deadline::after(kConnectionDeadline));
  if (!request) {
    reply(connection, request.code(), request.error().message);
    return;
  }
  FdRequest r{};
  if (request->bytes.size() != sizeof(r)) {
    reply(connection, Errc::kInvalidArgument,
          fmt::format("a request is {} bytes, not {}", request->bytes.size(), sizeof(r)));
    return;
  }
  std::memcpy(&r, request->bytes.data(), sizeof(r));
  if (r.magic != kFdSocketMagic) {
    reply(connection, Errc::kBadMagic, "not a kvrelay fd request");
    return;
  }
  if (r.op == static_cast<uint32_t>(FdOp::kPut)) {
    if (request->fds.empty() || r.count != request->fds.size()) {
      reply(connection, Errc::kInvalidArgument,
            fmt::format("the request announced {} fds and {} came", r.count, request->fds.size()));
      return;
    }
    const uint64_t ticket = r.ticket != 0 ? r.ticket : fresh_ticket();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (r.ticket != 0) {
        auto it = unclaimed_.find(r.ticket);
        if (it == unclaimed_.end()) {
          reply(connection, Errc::kNotFound,
                fmt::format("no fds wait under ticket {:016x} to append to", r.ticket));
          return;
        }
        if (it->second.fds.size() + request->fds.size() > kMaxFdsPerTicket) {
          reply(connection, Errc::kTooLarge,
                fmt::format("over {} fds under one ticket", kMaxFdsPerTicket));
          return;
        }
        for (UniqueFd& fd : request->fds)
          it->second.fds.push_back(std::move(fd));
      } else {
        if (unclaimed_.size() >= kMaxUnclaimed) {
          reply(connection, Errc::kFull,
                fmt::format("{} sets of fds already wait for their RegisterPool", kMaxUnclaimed));
          return;
        }
        unclaimed_[ticket] =
            Unclaimed{mono_now_ns() + ns_of(kUnclaimedFdsLifetime), std::move(request->fds)};
      }
    }
    spdlog::debug("rank {}: took {} fds from pid {} under ticket {:016x}", rank_, r.count, peer.pid,
                  ticket);
    reply(connection, Errc::kOk, "", ticket);
    return;
  }
  if (r.op == static_cast<uint32_t>(FdOp::kGet) && r.tier < 2) {
    std::lock_guard<std::mutex> lock(mu_);
    const Published& p = published_[r.tier];
    if (p.descriptor.empty()) {
      reply(connection, Errc::kNotFound,
            fmt::format("rank {} serves no engine-registered {} pool", rank_,
                        r.tier == 0 ? "device" : "host"));
      return;
    }
    std::vector<int> fds;
    for (const UniqueFd& fd : p.fds)
      fds.push_back(fd.get());  // the kernel duplicates them
    reply(connection, Errc::kOk, "", p.ticket, p.descriptor, fds);
    return;
  }
  reply(connection, Errc::kInvalidArgument, fmt::format("unknown request {}", r.op));
}

void FdSocketServer::expire(uint64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(unclaimed_, [&](const auto& entry) {
    if (entry.second.expires_ns > now_ns) return false;
    spdlog::warn(
        "rank {}: closing {} fds passed under ticket {:016x}: no RegisterPool claimed "
        "them within {} s",
        rank_, entry.second.fds.size(), entry.first, kUnclaimedFdsLifetime.count());
    return true;
  });
}

Result<std::vector<UniqueFd>> FdSocketServer::claim(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = unclaimed_.find(ticket);
  if (it == unclaimed_.end())
    return make_error(Errc::kNotFound,
                      fmt::format("no file descriptors wait under ticket {:016x} (never passed to "
                                  "rank {}, claimed already, or unclaimed for {} s)",
                                  ticket, rank_, kUnclaimedFdsLifetime.count()));
  std::vector<UniqueFd> fds = std::move(it->second.fds);
  unclaimed_.erase(it);
  return fds;
}

void FdSocketServer::publish(PoolTier tier, uint64_t ticket, std::vector<std::byte> descriptor,
                       std::vector<UniqueFd> fds) {
  std::lock_guard<std::mutex> lock(mu_);
  published_[static_cast<uint32_t>(tier)] =
      Published{ticket, std::move(descriptor), std::move(fds)};
}

void FdSocketServer::unpublish(PoolTier tier) {
  std::lock_guard<std::mutex> lock(mu_);
  published_[static_cast<uint32_t>(tier)] = Published{};
}

size_t FdSocketServer::unclaimed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unclaimed_.size();
}

}  // namespace kvrelay::worker
