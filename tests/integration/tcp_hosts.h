// Two instances on two hosts joined by tcp (support/two_hosts.h): the
// decode instance listens on host B with a key, the prefill instance sends
// from host A with the same key (or, to test refusals, another).
#pragma once

#include <gtest/gtest.h>

#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "integration/two_instances.h"
#include "two_hosts.h"

namespace kvrelay::testing {

class TcpHosts {
 public:
  TcpHosts(const std::string& tag, uint32_t tp) : hosts_(sim::TwoHosts::make(tag)) {
    if (key_.path().empty()) throw std::runtime_error("cannot make a key file");
    if (!hosts_->isolated())
      std::cerr << "[ note     ] no network namespaces (" << hosts_->why_not_isolated()
                << "): both hosts are loopback addresses of this one\n";
    ports_ = hosts_->isolated() ? std::vector<uint16_t>{}
                                : sim::free_tcp_ports(tp, hosts_->address_b());
    for (uint32_t r = 0; hosts_->isolated() && r < tp; ++r)
      ports_.push_back(static_cast<uint16_t>(7300 + r));  // host B is empty: any port is free
  }
  sim::TwoHosts& hosts() { return *hosts_; }

  // The decode instance on B listening with the key; the prefill on A with
  // `prefill_key` (default: the same key).
  Placement placement(const std::string& prefill_key = "") const {
    std::string list;
    for (uint16_t p : ports_)
      list += (list.empty() ? "" : ",") + std::to_string(p);
    Placement p;
    p.decode_prefix = hosts_->on_b();
    p.prefill_prefix = hosts_->on_a();
    p.decode_extra = {"--protocol",     "ipc,tcp",          "--tcp-ports",
                      list,             "--listen-address", hosts_->address_b(),
                      "--auth-key-file", key_.path()};
    p.prefill_extra = {"--protocol", "ipc,tcp", "--auth-key-file",
                       prefill_key.empty() ? key_.path() : prefill_key};
    return p;
  }
  Route route() const { return Route{Protocol::kTcp, hosts_->address_b(), ports_}; }

 private:
  std::unique_ptr<sim::TwoHosts> hosts_;
  sim::TemporaryKey key_;
  std::vector<uint16_t> ports_;
};

}  // namespace kvrelay::testing
