// Two hosts on one machine, for the network tests and the tcp benchmark:
// two network namespaces joined by a veth pair (198.18.213.1 and 198.18.213.2),
// made by the caller (root; CI runs as root) and removed when it is done.
// Where they cannot be made (not root, no `ip`), it falls back to two
// loopback addresses of this host and says why: what needs a real link
// (taking it down) is then skipped. Also: a temporary key file for the tcp
// transport, and free ports.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shm/result.h"

namespace kvrelay::sim {

class TwoHosts {
 public:
  // `tag` keeps concurrent tests' namespaces apart.
  static std::unique_ptr<TwoHosts> make(const std::string& tag);
  ~TwoHosts();
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  bool isolated() const { return isolated_; }  // namespaces, not the loopback fallback
  const std::string& why_not_isolated() const { return why_; }
  // Run a process on host A (the prefill side) or B (the decode side).
  std::vector<std::string> on_a() const;
  std::vector<std::string> on_b() const;
  const std::string& address_a() const { return address_a_; }
  const std::string& address_b() const { return address_b_; }
  // Takes the link down (no reset reaches either side) / up again.
  bool set_link(bool up);
  // Moves the calling thread (and the threads it starts afterwards) into
  // host A's or B's network namespace; a no-op on the loopback fallback.
  Status enter(bool host_a) const;

 private:
  TwoHosts() = default;
  bool isolated_ = false;
  std::string why_;
  std::string ns_a_, ns_b_, veth_a_, veth_b_;
  std::string address_a_ = "127.0.0.1", address_b_ = "127.0.0.2";
};

// A fresh 0600 key file of 32 random bytes in a private temporary folder
// (/tmp/kvrelay-key-<pid>-XXXXXX), removed when the object goes. A process
// killed outright (SIGKILL) cannot remove its own: the next TemporaryKey of
// the same user removes those whose process is gone, so key material does
// not pile up in /tmp.
class TemporaryKey {
 public:
  TemporaryKey();
  ~TemporaryKey();
  TemporaryKey(const TemporaryKey&) = delete;
  TemporaryKey& operator=(const TemporaryKey&) = delete;
  const std::string& path() const { return path_; }  // empty when it could not be made

 private:
  std::string dir_, path_;
};

// `n` TCP ports that were free on `address` a moment ago (empty on failure).
std::vector<uint16_t> free_tcp_ports(uint32_t n, const std::string& address);

}  // namespace kvrelay::sim
