// Two hosts on one machine for the network tests: two network namespaces
// joined by a veth pair (10.213.0.1 and 10.213.0.2), made by the test
// itself (root; CI runs as root) and removed when it ends. Where they cannot
// be made (not root, no `ip`), it falls back to two loopback addresses of
// this host and says so: what needs a real link (taking it down) is then
// skipped.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace kvrelay::testing {

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

 private:
  TwoHosts() = default;
  bool isolated_ = false;
  std::string why_;
  std::string ns_a_, ns_b_, veth_a_, veth_b_;
  std::string address_a_ = "127.0.0.1", address_b_ = "127.0.0.2";
};

}  // namespace kvrelay::testing
