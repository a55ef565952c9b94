// Rank r's fd socket: how file descriptors reach a worker, and leave it.
// Memory shared by file descriptor (CUDA VMM allocations exported as POSIX
// fds, memfds) cannot travel through the rings, so each worker listens on
// an abstract Unix socket, "kvrelay-<instance>-fds-r<rank>", and the kernel
// moves the fds (SCM_RIGHTS):
//
//   put  engine -> worker: the fds of a pool the engine is about to
//        register. The worker keeps them under a fresh random ticket and
//        answers it; more puts naming the ticket append to it (a message
//        carries at most kMaxPassedFds); the RegisterPool that follows names
//        the ticket (PoolDescriptor.fdTicket). Fds nobody claims are closed
//        after kUnclaimedFdsLifetime.
//   get  peer worker -> worker: the pool this rank serves now (its
//        descriptor, opaque here, and its fds), so that a prefill worker
//        on this host can map a decode rank's engine-registered pool.
//
// One request and one reply per connection (SOCK_SEQPACKET keeps message
// boundaries and the fds with their message). The worker answers only
// processes of its own user (SO_PEERCRED).
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvrelay/deadline.h"
#include "kvrelay/types.h"
#include "shm/result.h"
#include "shm/unique_fd.h"

namespace kvrelay {

inline constexpr uint32_t kFdSocketMagic = 0x4446564b;  // "KVFD"
inline constexpr size_t kMaxPassedFds = 253;            // SCM_MAX_FD: per message
inline constexpr size_t kMaxFdsPerTicket = 16384;       // per registration
inline constexpr size_t kMaxFdReplyPayload =
    128 * 1024;  // under a Unix socket's default send buffer
inline constexpr std::chrono::seconds kUnclaimedFdsLifetime{60};

enum class FdOp : uint32_t { kPut = 1, kGet = 2 };

struct FdRequest {
  uint32_t magic;
  uint32_t op;      // FdOp
  uint32_t tier;    // kGet: PoolTier
  uint32_t count;   // kPut: fds attached
  uint64_t ticket;  // kPut: 0 for a new set, else the set to append to
};

inline constexpr size_t kFdReplyMessageBytes = 200;

struct FdReply {
  uint32_t magic;
  uint32_t code;                       // Errc; 0 ok
  uint64_t ticket;                     // kPut: the ticket; kGet: the pool's registration ticket
  uint32_t count;                      // fds attached
  uint32_t payload_bytes;              // kGet: the descriptor that follows this header
  char message[kFdReplyMessageBytes];  // NUL-terminated; why, when code != 0
};

// The socket's address: an abstract name (leading NUL), so nothing is left
// in the file system when a worker dies.
std::string fd_socket_name(std::string_view instance, uint32_t rank);
struct FdSocketAddress {
  sockaddr_un addr;
  socklen_t len;
};
Result<FdSocketAddress> fd_socket_address(std::string_view instance, uint32_t rank);

// One message and the fds that came with it.
struct FdMessage {
  std::vector<std::byte> bytes;
  std::vector<UniqueFd> fds;
};

// Sends `bytes` with `fds` attached, as one message.
Status send_fd_message(int sock, std::span<const std::byte> bytes, std::span<const int> fds);
// Receives one message of at most `max_bytes` with at most `max_fds` fds,
// waiting until `deadline`; kTimeout, or kInvalidArgument when the peer
// sent more than that (whatever arrived is closed).
Result<FdMessage> receive_fd_message(int sock, size_t max_bytes, size_t max_fds, Deadline deadline);

// Engine side: hands `fds` to rank `rank`'s worker of `instance` (in as
// many messages as it takes), under `ticket` when not 0 (appending), else
// under a fresh one; the ticket. kNotFound when no worker listens.
Result<uint64_t> pass_fds(std::string_view instance, uint32_t rank, std::span<const int> fds,
                          Deadline deadline, uint64_t ticket = 0);

// Peer side: the pool rank `rank` of `instance` serves in `tier`, with its
// registration ticket, its descriptor (as the worker encoded it) and fds.
struct SharedPool {
  uint64_t ticket = 0;
  std::vector<std::byte> descriptor;
  std::vector<UniqueFd> fds;
};
Result<SharedPool> fetch_shared_pool(std::string_view instance, uint32_t rank, PoolTier tier,
                                     Deadline deadline);

}  // namespace kvrelay
