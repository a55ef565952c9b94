#include "support/instance.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <thread>

#include "instance/control_segment.h"
#include "instance/names.h"
#include "shm/liveness.h"
#include "shm/spawn.h"
#include "support/processes.h"

namespace kvrelay::testing {

std::string Instance::bin(const std::string& program) {
  // Beside the running test binary first: a bundle of binaries moved to
  // another machine (tools/gpu-check) runs its own, not the build's.
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && std::filesystem::exists(self.parent_path() / program))
    return (self.parent_path() / program).string();
  return std::string(KVRELAY_BIN_DIR) + "/" + program;
}

pid_t spawn_program(const std::vector<std::string>& args) {
  Result<pid_t> pid = spawn_process(args);
  return pid ? *pid : -1;
}

int run_program(const std::vector<std::string>& args, std::string* output,
                std::chrono::milliseconds within) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  SpawnOptions options;
  options.output_fd = fds[1];
  Result<pid_t> spawned = spawn_process(args, options);
  close(fds[1]);
  if (!spawned) {
    close(fds[0]);
    return -1;
  }
  const pid_t pid = *spawned;
  fcntl(fds[0], F_SETFL, O_NONBLOCK);
  std::string out;
  const auto until = std::chrono::steady_clock::now() + within;
  int status = 0;
  for (;;) {
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof(buf))) > 0)
      out.append(buf, static_cast<size_t>(n));
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    if (std::chrono::steady_clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      close(fds[0]);
      if (output != nullptr) *output = out;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0)
    out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  if (output != nullptr) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::unique_ptr<Instance> Instance::start(const InstanceArgs& a,
                                          std::chrono::milliseconds ready_within) {
  std::vector<std::string> argv = {bin("kvrelay-coordinator"),
                                   "--instance",
                                   a.instance,
                                   "--role",
                                   a.role,
                                   "--tp-size",
                                   std::to_string(a.tp),
                                   "--num-layers",
                                   std::to_string(a.layers),
                                   "--num-blocks",
                                   std::to_string(a.blocks),
                                   "--num-host-blocks",
                                   std::to_string(a.host_blocks),
                                   "--block-size",
                                   std::to_string(a.block_size),
                                   "--kv-heads",
                                   std::to_string(a.kv_heads),
                                   "--head-dim",
                                   std::to_string(a.head_dim),
                                   "--dtype",
                                   a.dtype,
                                   "--request-deadline-ms",
                                   std::to_string(a.deadline_ms),
                                   "--log-level",
                                   "warn",
                                   "--drain-timeout-ms",
                                   "3000"};
  if (a.extra_layers > 0) {
    argv.push_back("--extra-layers");
    argv.push_back(std::to_string(a.extra_layers));
  }
  if (a.external_workers) argv.push_back("--external-workers");
  argv.insert(argv.end(), a.extra.begin(), a.extra.end());
  argv.insert(argv.begin(), a.prefix.begin(), a.prefix.end());
  auto inst = std::unique_ptr<Instance>(new Instance());
  inst->name_ = a.instance;
  inst->pid_ = spawn_program(argv);
  if (inst->pid_ < 0) throw std::runtime_error("cannot start kvrelay-coordinator");
  if (a.external_workers) return inst;  // the caller starts the workers and attaches
  const auto until = Deadline::after(ready_within);
  for (;;) {
    auto c = Client::attach(a.instance, until);
    if (c) {
      inst->client_ = std::make_unique<Client>(std::move(c).value());
      return inst;
    }
    if (until.passed() || waitpid(inst->pid_, nullptr, WNOHANG) == inst->pid_)
      throw std::runtime_error("instance " + a.instance +
                               " did not become ready: " + c.error().message);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Instance::~Instance() {
  if (pid_ > 0) {
    stop(std::chrono::seconds(10));
    if (pid_ > 0) kill9();
  }
  for (const std::string& s : leftover_segments())
    (void)unlink(("/dev/shm/" + s).c_str());
}

int Instance::stop(std::chrono::milliseconds within) {
  if (pid_ <= 0) return -1;
  client_.reset();
  kill(pid_, SIGTERM);
  auto exit = wait_child(pid_, within);  // kills it on timeout
  pid_ = -1;
  if (!exit) return -1;
  return exit->exited ? exit->code : 128 + exit->signal;
}

void Instance::kill9() {
  if (pid_ <= 0) return;
  kill_child(pid_);
  pid_ = -1;
}

std::vector<std::string> Instance::leftover_segments() const {
  std::vector<std::string> out;
  const std::string prefix = control_segment_name(name_);
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string n = e.path().filename().string();
    if (n == prefix || n.rfind(prefix + "-", 0) == 0) out.push_back(n);
  }
  return out;
}

uint32_t worker_pid(const std::string& instance, uint32_t rank) {
  auto c = ControlSegment::attach(
      instance, AttachOptions{.access = SegmentAccess::kReadOnly, .allow_stale = true});
  return c ? read_slot(c->worker_slot(rank)).owner.pid : 0;
}

}  // namespace kvrelay::testing
