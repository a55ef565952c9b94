#include "instance/fd_socket.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "instance/names.h"

namespace kvrelay {

std::string fd_socket_name(std::string_view instance, uint32_t rank) {
  std::string name(1, '\0');
  name += fmt::format("{}{}-fds-r{}", kSegmentPrefix, instance, rank);
  return name;
}

Result<FdSocketAddress> fd_socket_address(std::string_view instance, uint32_t rank) {
  const std::string name = fd_socket_name(instance, rank);
  FdSocketAddress a{};
  a.addr.sun_family = AF_UNIX;
  if (name.size() > sizeof(a.addr.sun_path))
    return make_error(Errc::kInvalidArgument, "the instance name is too long for an fd socket");
  std::memcpy(a.addr.sun_path, name.data(), name.size());
  a.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  return a;
}

Status send_fd_message(int sock, std::span<const std::byte> bytes, std::span<const int> fds) {
  if (fds.size() > kMaxPassedFds)
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("{} file descriptors; at most {} pass at once", fds.size(), kMaxPassedFds));
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) return {};
    if (errno != EINTR) return system_error("sendmsg on the fd socket", errno);
  }
}

Result<FdMessage> receive_fd_message(int sock, size_t max_bytes, size_t max_fds,
                                     Deadline deadline) {
  for (;;) {
    pollfd p{sock, POLLIN, 0};
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.remaining());
    const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms.count(), 1000)));
    if (r < 0 && errno != EINTR) return system_error("poll on the fd socket", errno);
    if (r > 0) break;
    if (deadline.passed())
      return make_error(Errc::kTimeout, "no answer on the fd socket before the deadline");
  }
  FdMessage out;
  // One byte more than allowed: a message that fills it was too long.
  out.bytes.resize(max_bytes + 1);
  iovec iov{out.bytes.data(), out.bytes.size()};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(1, max_fds)));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return system_error("recvmsg on the fd socket", errno);
  // Take ownership of whatever fds came, even if the message is refused.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out.fds.emplace_back(fd);
    }
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0 || out.fds.size() > max_fds)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("more than {} file descriptors arrived in one message", max_fds));
  if ((msg.msg_flags & MSG_TRUNC) != 0 || static_cast<size_t>(n) > max_bytes)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("a message over {} bytes arrived on the fd socket", max_bytes));
  if (n == 0) return make_error(Errc::kNotFound, "the fd socket's peer closed the connection");
  out.bytes.resize(static_cast<size_t>(n));
  return out;
}

namespace {

Result<UniqueFd> connect_to(std::string_view instance, uint32_t rank) {
  UniqueFd sock(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return system_error("socket(AF_UNIX)", errno);
  Result<FdSocketAddress> a = fd_socket_address(instance, rank);
  if (!a) return a.error();
  if (connect(sock.get(), reinterpret_cast<const sockaddr*>(&a->addr), a->len) != 0) {
    if (errno == ECONNREFUSED || errno == ENOENT)
      return make_error(Errc::kNotFound,
                        fmt::format("rank {} of instance '{}' has no worker listening for file "
                                    "descriptors (is it running?)",
                                    rank, instance));
    return system_error(fmt::format("connecting to rank {}'s fd socket", rank), errno);
  }
  return sock;
}

// Sends the request and reads the reply's header (and what follows it).
Result<FdMessage> ask(std::string_view instance, uint32_t rank, const FdRequest& request,
                      std::span<const int> fds, Deadline deadline) {
  Result<UniqueFd> sock = connect_to(instance, rank);
  if (!sock) return sock.error();
  if (Status s =
          send_fd_message(sock->get(), std::as_bytes(std::span<const FdRequest>(&request, 1)), fds);
      !s)
    return s.error();
  Result<FdMessage> reply = receive_fd_message(sock->get(), sizeof(FdReply) + kMaxFdReplyPayload,
                                               kMaxPassedFds, deadline);
  if (!reply) return reply.error();
  FdReply header;
  if (reply->bytes.size() < sizeof(header))
    return make_error(Errc::kCorrupt, fmt::format("rank {}'s fd socket answered {} bytes", rank,
                                                  reply->bytes.size()));
  std::memcpy(&header, reply->bytes.data(), sizeof(header));
  if (header.magic != kFdSocketMagic)
    return make_error(Errc::kCorrupt, fmt::format("rank {}'s fd socket answered garbage", rank));
  if (header.code != 0) {
    header.message[kFdReplyMessageBytes - 1] = '\0';
    const auto code = static_cast<Errc>(header.code);
    return make_error(code <= Errc::kUnsupported ? code : Errc::kSystem,
                      fmt::format("rank {}'s worker: {}", rank, header.message));
  }
  if (header.count != reply->fds.size() ||
      header.payload_bytes != reply->bytes.size() - sizeof(header))
    return make_error(Errc::kCorrupt,
                      fmt::format("rank {}'s fd socket answered {} fds and {} bytes, announced {} "
                                  "and {}",
                                  rank, reply->fds.size(), reply->bytes.size() - sizeof(header),
                                  header.count, header.payload_bytes));
  return reply;
}

FdReply reply_header(const FdMessage& m) {
  FdReply h;
  std::memcpy(&h, m.bytes.data(), sizeof(h));
  return h;
}

}  // namespace

Result<uint64_t> pass_fds(std::string_view instance, uint32_t rank, std::span<const int> fds,
                          Deadline deadline, uint64_t ticket) {
  if (fds.empty() || fds.size() > kMaxFdsPerTicket)
    return make_error(
        Errc::kInvalidArgument,
        fmt::format("{} file descriptors: pass between 1 and {}", fds.size(), kMaxFdsPerTicket));
  for (size_t first = 0; first < fds.size(); first += kMaxPassedFds) {
    const std::span<const int> part =
        fds.subspan(first, std::min(kMaxPassedFds, fds.size() - first));
    const FdRequest request{kFdSocketMagic, static_cast<uint32_t>(FdOp::kPut), 0,
                            static_cast<uint32_t>(part.size()), ticket};
    Result<FdMessage> reply = ask(instance, rank, request, part, deadline);
    if (!reply) return reply.error();
    ticket = reply_header(*reply).ticket;
  }
  return ticket;
}

Result<SharedPool> fetch_shared_pool(std::string_view instance, uint32_t rank, PoolTier tier,
                                     Deadline deadline) {
  const FdRequest request{kFdSocketMagic, static_cast<uint32_t>(FdOp::kGet),
                          static_cast<uint32_t>(tier), 0, 0};
  Result<FdMessage> reply = ask(instance, rank, request, {}, deadline);
  if (!reply) return reply.error();
  SharedPool pool;
  pool.ticket = reply_header(*reply).ticket;
  pool.descriptor.assign(reply->bytes.begin() + sizeof(FdReply), reply->bytes.end());
  pool.fds = std::move(reply->fds);
  return pool;
}

}  // namespace kvrelay
