// Two instances on two hosts joined by tcp (support/two_hosts.h): the
// decode instance listens on host B with a key, the prefill instance sends
// from host A with the same key (or, to test refusals, another).
#pragma once

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "integration/two_instances.h"
#include "support/two_hosts.h"

namespace kvrelay::testing {

// A 0600 file of 32 random bytes in a private folder, removed at the end.
class KeyFileForTest {
 public:
  KeyFileForTest() {
    char dir[] = "/tmp/kvrelay-test-key-XXXXXX";
    if (::mkdtemp(dir) == nullptr) throw std::runtime_error("mkdtemp");
    dir_ = dir;
    path_ = dir_ + "/key";
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    std::random_device rd;
    unsigned char bytes[32];
    for (unsigned char& b : bytes)
      b = static_cast<unsigned char>(rd());
    if (fd < 0 || ::write(fd, bytes, sizeof(bytes)) != sizeof(bytes))
      throw std::runtime_error("cannot write a key file");
    ::close(fd);
  }
  ~KeyFileForTest() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
};

// Ports free on `address` a moment ago (a fallback host shares this one's ports).
inline std::vector<uint16_t> free_ports(uint32_t n, const std::string& address) {
  std::vector<uint16_t> ports;
  std::vector<int> held;
  for (uint32_t i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
    socklen_t len = sizeof(a);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("no free port on " + address);
    held.push_back(fd);
    ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : held)
    ::close(fd);
  return ports;
}

class TcpHosts {
 public:
  TcpHosts(const std::string& tag, uint32_t tp) : hosts_(TwoHosts::make(tag)) {
    if (!hosts_->isolated())
      std::cerr << "[ note     ] no network namespaces (" << hosts_->why_not_isolated()
                << "): both hosts are loopback addresses of this one\n";
    ports_ = hosts_->isolated() ? std::vector<uint16_t>{} : free_ports(tp, hosts_->address_b());
    for (uint32_t r = 0; hosts_->isolated() && r < tp; ++r)
      ports_.push_back(static_cast<uint16_t>(7300 + r));  // host B is empty: any port is free
  }
  TwoHosts& hosts() { return *hosts_; }

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
  std::unique_ptr<TwoHosts> hosts_;
  KeyFileForTest key_;
  std::vector<uint16_t> ports_;
};

}  // namespace kvrelay::testing
