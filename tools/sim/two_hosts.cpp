#include "two_hosts.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include <filesystem>

#include "programs.h"

namespace kvrelay::sim {

namespace {

std::string ip_binary() { return find_program("ip").value_or("ip"); }

bool ip(const std::vector<std::string>& args, std::string* why) {
  std::vector<std::string> argv = {ip_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  Result<ProgramRun> run = run_program(argv);
  const bool ok = run && run->exit_code == 0;
  if (!ok && why != nullptr)
    *why = fmt::format("`ip {}` failed: {}", fmt::join(args, " "),
                       run ? run->output : run.error().message);
  return ok;
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
      ip({"-n", h->ns_a_, "addr", "add", "198.18.213.1/24", "dev", h->veth_a_}, &why) &&
      ip({"-n", h->ns_b_, "addr", "add", "198.18.213.2/24", "dev", h->veth_b_}, &why) &&
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
  h->address_a_ = "198.18.213.1";
  h->address_b_ = "198.18.213.2";
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

Status TwoHosts::enter(bool host_a) const {
  if (!isolated_) return {};
  const std::string path = "/var/run/netns/" + (host_a ? ns_a_ : ns_b_);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(Errc::kSystem, fmt::format("open {}: {}", path, errno));
  const int rc = ::setns(fd, CLONE_NEWNET);
  ::close(fd);
  if (rc != 0) return make_error(Errc::kSystem, fmt::format("setns {}: errno {}", path, errno));
  return {};
}

namespace {

// Removes the key folders of this user's processes that are gone.
void remove_orphaned_keys() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/tmp", ec)) {
    const std::string name = entry.path().filename().string();
    const std::string prefix = "kvrelay-key-";
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t dash = name.find('-', prefix.size());
    if (dash == std::string::npos) continue;  // no pid in its name
    pid_t pid = 0;
    try {
      pid = static_cast<pid_t>(std::stol(name.substr(prefix.size(), dash - prefix.size())));
    } catch (...) {
      continue;
    }
    struct stat st {};
    if (pid <= 0 || ::lstat(entry.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::geteuid())
      continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    std::filesystem::remove_all(entry.path(), ec);
  }
}

}  // namespace

TemporaryKey::TemporaryKey() {
  remove_orphaned_keys();
  std::string pattern = fmt::format("/tmp/kvrelay-key-{}-XXXXXX", ::getpid());
  char* dir = pattern.data();
  if (::mkdtemp(dir) == nullptr) return;
  dir_ = dir;
  const std::string path = dir_ + "/key";
  const int out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  const int in = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  unsigned char key[32];
  const bool ok = out >= 0 && in >= 0 && ::read(in, key, sizeof(key)) == sizeof(key) &&
                  ::write(out, key, sizeof(key)) == sizeof(key);
  if (out >= 0) ::close(out);
  if (in >= 0) ::close(in);
  if (ok) path_ = path;
}

TemporaryKey::~TemporaryKey() {
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::vector<uint16_t> free_tcp_ports(uint32_t n, const std::string& address) {
  std::vector<uint16_t> ports;
  std::vector<int> held;  // held until all are chosen: no port twice
  for (uint32_t i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
    socklen_t len = sizeof(a);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      if (fd >= 0) ::close(fd);
      ports.clear();
      break;
    }
    held.push_back(fd);
    ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : held)
    ::close(fd);
  return ports;
}

}  // namespace kvrelay::sim
