#include "instances.h"

#include <fmt/format.h>
#include <signal.h>
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
  if (g.k_only) args.push_back("--k-only");
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

}  // namespace kvrelay::sim
