#include "instances.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "shm/spawn.h"

namespace kvrelay::sim {

std::string binary_next_to_me(const std::string& program) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? program : (self.parent_path() / program).string();
}

Status ManagedInstance::start(const std::string& name, const std::string& role, const Geometry& g,
                              const std::string& log_dir, const std::string& log_level,
                              const std::vector<std::string>& extra) {
  std::vector<std::string> args = {
      binary_next_to_me("kvrelay-coordinator"), "--instance", name, "--role", role, "--tp-size",
      std::to_string(g.tp), "--num-layers", std::to_string(g.layers), "--extra-layers",
      std::to_string(g.extra_layers), "--num-blocks", std::to_string(g.blocks), "--num-host-blocks",
      std::to_string(g.host_blocks), "--block-size", std::to_string(g.block_size), "--kv-heads",
      std::to_string(g.kv_heads), "--head-dim", std::to_string(g.head_dim), "--dtype", g.dtype,
      "--log-level", log_level,
      // The simulator stops them only after its run: whatever is
      // still in flight then never gets its signals.
      "--drain-timeout-ms", "1000"};
  if (!log_dir.empty()) {
    // One folder per instance: both instances name their files alike.
    args.push_back("--log-dir");
    args.push_back(log_dir + "/" + name);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  // The instances go with the simulator, however it dies.
  SpawnOptions spawn;
  spawn.die_with_parent = true;
  Result<pid_t> pid = spawn_process(args, spawn);
  if (!pid) return pid.error();
  pid_ = *pid;
  return {};
}

int ManagedInstance::stop() {
  if (pid_ <= 0) return 0;
  kill(pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 300; ++i) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return -1;
}

ManagedInstance::~ManagedInstance() {
  stop();
}

TemporaryKey::TemporaryKey() {
  char dir[] = "/tmp/kvrelay-sim-key-XXXXXX";
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
  std::vector<int> held;
  for (uint32_t i = 0; i < n; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    ::inet_pton(AF_INET, address.c_str(), &a.sin_addr);
    socklen_t len = sizeof(a);
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      if (fd >= 0) ::close(fd);
      break;
    }
    held.push_back(fd);  // held until all are chosen: no port twice
    ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : held)
    ::close(fd);
  return ports;
}

}  // namespace kvrelay::sim
