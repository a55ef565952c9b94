#include "programs.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

#include "shm/spawn.h"
#include "shm/unique_fd.h"

namespace kvrelay::sim {

std::optional<std::string> find_program(const std::string& name) {
  std::string path = ::getenv("PATH") != nullptr ? ::getenv("PATH") : "";
  path += ":/usr/sbin:/sbin:/usr/bin:/bin";
  size_t at = 0;
  while (at <= path.size()) {
    const size_t end = std::min(path.find(':', at), path.size());
    const std::string candidate = path.substr(at, end - at) + "/" + name;
    if (end > at && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    at = end + 1;
  }
  return std::nullopt;
}

Result<ProgramRun> run_program(const std::vector<std::string>& argv) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return system_error("pipe2", errno);
  UniqueFd read_end(fds[0]);
  SpawnOptions options;
  options.output_fd = fds[1];
  Result<pid_t> pid = spawn_process(argv, options);
  ::close(fds[1]);
  if (!pid) return pid.error();
  ProgramRun run;
  char buf[4096];
  for (ssize_t n; (n = ::read(read_end.get(), buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    run.output.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (::waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

bool reap_if_exited(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, WNOHANG) == pid;
}

void end_child(pid_t pid, std::chrono::milliseconds grace) {
  const auto until = std::chrono::steady_clock::now() + grace;
  while (!reap_if_exited(pid)) {
    if (std::chrono::steady_clock::now() >= until) {
      ::kill(pid, SIGTERM);
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace kvrelay::sim
