#include "shm/spawn.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace kvrelay {

Result<pid_t> spawn_process(const std::vector<std::string>& args, const SpawnOptions& options) {
  if (args.empty()) return make_error(Errc::kInvalidArgument, "nothing to start");
  // Everything the child needs is built before fork: between fork and exec
  // the child calls only async-signal-safe functions.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    const std::string_view name(*e, eq != nullptr ? static_cast<size_t>(eq - *e) : strlen(*e));
    bool replaced = false;
    for (const std::string& add : options.environment)
      replaced = replaced || (add.size() > name.size() && add.compare(0, name.size(), name) == 0 &&
                              add[name.size()] == '=');
    if (!replaced) env_strings.emplace_back(*e);
  }
  for (const std::string& add : options.environment)
    env_strings.push_back(add);
  std::vector<std::string> arg_strings = args;
  std::vector<char*> argv;
  for (std::string& a : arg_strings)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (std::string& e : env_strings)
    envp.push_back(e.data());
  envp.push_back(nullptr);

  int report[2];  // exec failures come back through a close-on-exec pipe
  if (pipe2(report, O_CLOEXEC) != 0) return system_error("pipe", errno);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(report[0]);
    close(report[1]);
    return system_error("fork", err);
  }
  if (pid == 0) {
    close(report[0]);
    if (options.die_with_parent) {
      if (prctl(PR_SET_PDEATHSIG, options.parent_death_signal) != 0) _exit(127);
      if (getppid() != parent) _exit(127);  // the parent died before prctl
    }
    if (options.own_process_group && setpgid(0, 0) != 0) _exit(127);
    if (options.output_fd >= 0) {
      dup2(options.output_fd, 1);
      dup2(options.output_fd, 2);
    }
    execve(argv[0], argv.data(), envp.data());
    const int err = errno;
    (void)!write(report[1], &err, sizeof(err));
    _exit(127);
  }
  close(report[1]);
  int err = 0;
  const ssize_t n = read(report[0], &err, sizeof(err));
  close(report[0]);
  if (n == static_cast<ssize_t>(sizeof(err)))
    return system_error(fmt::format("cannot start {}", args[0]), err);
  return pid;
}

}  // namespace kvrelay
