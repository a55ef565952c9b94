#include "support/two_hosts.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "support/instance.h"

namespace kvrelay::testing {

namespace {

// Processes are started with execve, which does not search PATH.
std::string ip_binary() {
  std::string path = ::getenv("PATH") != nullptr ? ::getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/bin:/bin";
  size_t at = 0;
  while (at <= path.size()) {
    const size_t end = std::min(path.find(':', at), path.size());
    const std::string candidate = path.substr(at, end - at) + "/ip";
    if (end > at && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    at = end + 1;
  }
  return "ip";
}

bool ip(const std::vector<std::string>& args, std::string* why) {
  std::vector<std::string> argv = {ip_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  const int rc = run_program(argv, &out, std::chrono::seconds(10));
  if (rc != 0 && why != nullptr)
    *why = fmt::format("`ip {}` failed ({}): {}", fmt::join(args, " "), rc, out);
  return rc == 0;
}

}  // namespace

std::unique_ptr<TwoHosts> TwoHosts::make(const std::string& tag) {
  std::unique_ptr<TwoHosts> h(new TwoHosts());
  if (::access(ip_binary().c_str(), X_OK) != 0) {
    h->why_ = "no `ip` command (iproute2)";
    return h;
  }
  if (::geteuid() != 0) {
    h->why_ = "not root: network namespaces need CAP_SYS_ADMIN";
    return h;
  }
  const std::string id = fmt::format("{}{}", tag.substr(0, 4), getpid() % 100000);
  h->ns_a_ = "kvr-" + id + "-a";
  h->ns_b_ = "kvr-" + id + "-b";
  h->veth_a_ = "kv" + id + "a";  // interface names: at most 15 characters
  h->veth_b_ = "kv" + id + "b";
  std::string why;
  const bool ok =
      ip({"netns", "add", h->ns_a_}, &why) && ip({"netns", "add", h->ns_b_}, &why) &&
      ip({"link", "add", h->veth_a_, "type", "veth", "peer", "name", h->veth_b_}, &why) &&
      ip({"link", "set", h->veth_a_, "netns", h->ns_a_}, &why) &&
      ip({"link", "set", h->veth_b_, "netns", h->ns_b_}, &why) &&
      ip({"-n", h->ns_a_, "addr", "add", "10.213.0.1/24", "dev", h->veth_a_}, &why) &&
      ip({"-n", h->ns_b_, "addr", "add", "10.213.0.2/24", "dev", h->veth_b_}, &why) &&
      ip({"-n", h->ns_a_, "link", "set", "lo", "up"}, &why) &&
      ip({"-n", h->ns_b_, "link", "set", "lo", "up"}, &why) &&
      ip({"-n", h->ns_a_, "link", "set", h->veth_a_, "up"}, &why) &&
      ip({"-n", h->ns_b_, "link", "set", h->veth_b_, "up"}, &why);
  if (!ok) {
    h->why_ = why;
    (void)ip({"netns", "del", h->ns_a_}, nullptr);
    (void)ip({"netns", "del", h->ns_b_}, nullptr);
    h->ns_a_.clear();
    h->ns_b_.clear();
    return h;
  }
  h->isolated_ = true;
  h->address_a_ = "10.213.0.1";
  h->address_b_ = "10.213.0.2";
  return h;
}

TwoHosts::~TwoHosts() {
  // Deleting a namespace deletes its end of the pair, and so the pair.
  if (!ns_a_.empty()) (void)ip({"netns", "del", ns_a_}, nullptr);
  if (!ns_b_.empty()) (void)ip({"netns", "del", ns_b_}, nullptr);
}

std::vector<std::string> TwoHosts::on_a() const {
  if (!isolated_) return {};
  return {ip_binary(), "netns", "exec", ns_a_};
}

std::vector<std::string> TwoHosts::on_b() const {
  if (!isolated_) return {};
  return {ip_binary(), "netns", "exec", ns_b_};
}

bool TwoHosts::set_link(bool up) {
  if (!isolated_) return false;
  return ip({"-n", ns_a_, "link", "set", veth_a_, up ? "up" : "down"}, nullptr);
}

}  // namespace kvrelay::testing
