// A worker's end of its rank's fd socket (instance/fd_socket.h): a thread
// that accepts file descriptors from the engine (kept under a ticket until a
// RegisterPool claims them, closed after kUnclaimedFdsLifetime if none does)
// and hands the pool this rank serves to peer workers that ask for it.
//
// Only processes of the worker's own user are answered (SO_PEERCRED): the
// same trust as the pool segments, which are 0600.
//
// Thread-safety: claim/publish/unpublish are called by the worker's thread;
// the socket is served on the server's own thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "instance/fd_socket.h"
#include "kvrelay/types.h"

namespace kvrelay::worker {

class FdSocketServer {
 public:
  // Listens on rank `rank`'s socket of `instance`.
  static Result<std::unique_ptr<FdSocketServer>> start(std::string_view instance, uint32_t rank);
  ~FdSocketServer();
  FdSocketServer(const FdSocketServer&) = delete;
  FdSocketServer& operator=(const FdSocketServer&) = delete;

  // The fds passed under `ticket`, once; kNotFound when none were (or they
  // expired).
  Result<std::vector<UniqueFd>> claim(uint64_t ticket);
  // What a peer asking for `tier` gets from now on: `descriptor` (encoded
  // PoolDescriptor) and duplicates of `fds`.
  void publish(PoolTier tier, uint64_t ticket, std::vector<std::byte> descriptor,
               std::vector<UniqueFd> fds);
  void unpublish(PoolTier tier);

  // For tests: fds waiting to be claimed.
  size_t unclaimed() const;

 private:
  FdSocketServer(UniqueFd listener, UniqueFd stop, uint32_t rank);
  void serve();
  void answer(int connection);
  void expire(uint64_t now_ns);

  struct Unclaimed {
    uint64_t expires_ns;
    std::vector<UniqueFd> fds;
  };
  struct Published {
    uint64_t ticket = 0;
    std::vector<std::byte> descriptor;
    std::vector<UniqueFd> fds;
  };

  UniqueFd listener_;
  UniqueFd stop_;  // an eventfd: the destructor wakes the thread at once
  uint32_t rank_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Unclaimed> unclaimed_;
  Published published_[2];  // by PoolTier
  std::thread thread_;
};

}  // namespace kvrelay::worker
