#include "perftest_baseline.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <optional>
#include <sstream>
#include <thread>

#include "programs.h"
#include "shm/spawn.h"
#include "shm/unique_fd.h"

namespace kvrelay::bench {
namespace {

using Clock = std::chrono::steady_clock;

// How long a server may take to listen, and one run may take. An emulated
// guest beside other tests took over a second to bring the server up; a
// measured run moves tens of MiB at tens of MB/s there.
constexpr int kListenSeconds = 60;
constexpr int kRunSeconds = 240;
constexpr uint16_t kPort = 18515;  // perftest's own default

// Reaps it when it has exited.
bool exited(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, WNOHANG) == pid;
}

// The last lines of a program's output, for an error a user reads.
std::string tail(const std::string& output, size_t lines = 3) {
  size_t at = output.size();
  while (at > 0 && output[at - 1] == '\n')
    --at;
  const size_t end = at;
  for (size_t n = 0; at > 0 && n < lines; --at)
    if (output[at - 1] == '\n' && ++n == lines) break;
  std::string t = output.substr(at, end - at);
  for (char& c : t)
    if (c == '\n') c = ' ';
  return t.empty() ? "(no output)" : t;
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof(buf), at);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    at += n;
  }
  return out;
}

// The average MB/s of the result row for `bytes`, when the output has one.
std::optional<double> parse_average(const std::string& output, uint64_t bytes) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    unsigned long long b = 0, it = 0;
    double peak = 0, avg = 0;
    if (std::sscanf(line.c_str(), " %llu %llu %lf %lf", &b, &it, &peak, &avg) == 4 && b == bytes)
      return avg;
  }
  return std::nullopt;
}

}  // namespace

Result<double> run_ib_write_bw(const PerftestRun& run) {
  const std::optional<std::string> perftest = sim::find_program("ib_write_bw");
  const std::optional<std::string> timeout = sim::find_program("timeout");
  if (!perftest) return make_error(Errc::kUnsupported, "ib_write_bw is not installed (perftest)");
  if (!timeout) return make_error(Errc::kUnsupported, "timeout (coreutils) is not installed");
  // Both sides under coreutils' timeout: a peer that stops answering cannot
  // hold the bench past its own deadline.
  auto command = [&](int seconds) {
    return std::vector<std::string>{*timeout,
                                    "-k",
                                    "5",
                                    std::to_string(seconds),
                                    *perftest,
                                    "-d",
                                    run.device,
                                    "-x",
                                    std::to_string(run.gid_index),
                                    "-q",
                                    std::to_string(run.queue_pairs),
                                    "-s",
                                    std::to_string(run.message_bytes),
                                    "-n",
                                    std::to_string(run.iterations),
                                    "-F",
                                    "-p",
                                    std::to_string(kPort)};
  };
  // The server's output stays in memory for the error, should it fail.
  UniqueFd server_output(::memfd_create("ib_write_bw-server", MFD_CLOEXEC));
  if (server_output.get() < 0) return system_error("memfd_create", errno);
  SpawnOptions o;
  o.die_with_parent = true;
  o.output_fd = server_output.get();
  Result<pid_t> server = spawn_process(command(kListenSeconds + kRunSeconds), o);
  if (!server)
    return make_error(server.error().code,
                      "cannot start the ib_write_bw server: " + server.error().message);

  std::vector<std::string> client = command(kRunSeconds);
  client.push_back("127.0.0.1");
  Result<double> result =
      make_error(Errc::kTimeout,
                 fmt::format("the ib_write_bw server did not listen within {} s", kListenSeconds));
  bool server_reaped = false;
  const auto listen_until = Clock::now() + std::chrono::seconds(kListenSeconds);
  while (Clock::now() < listen_until) {
    if (exited(*server)) {
      server_reaped = true;
      result = make_error(Errc::kSystem, "the ib_write_bw server exited before its client ran: " +
                                             tail(read_all(server_output.get())));
      break;
    }
    const Result<sim::ProgramRun> r = sim::run_program(client);
    if (!r) {
      result = r.error();
      break;
    }
    if (const std::optional<double> mbps = parse_average(r->output, run.message_bytes)) {
      result = *mbps;
      break;
    }
    // Refused: the server is not listening yet. A client that connected and
    // failed is the answer, whatever the server does next.
    if (r->output.find("Couldn't connect") == std::string::npos) {
      result = make_error(Errc::kSystem,
                          r->exit_code == 124
                              ? fmt::format("the ib_write_bw client ran past {} s", kRunSeconds)
                              : fmt::format("the ib_write_bw client failed (exit {}): {}",
                                            r->exit_code, tail(r->output)));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // The server ends with its client; one that outlives it by seconds is stuck.
  for (int i = 0; i < 100 && !server_reaped; ++i) {
    server_reaped = exited(*server);
    if (!server_reaped) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!server_reaped) {        // a reaped server's pid may be another process's now: no stray kill
    ::kill(*server, SIGTERM);  // timeout(1) passes it on, and SIGKILLs 5 s later
    int status = 0;
    while (::waitpid(*server, &status, 0) < 0 && errno == EINTR) {
    }
  }
  return result;
}

}  // namespace kvrelay::bench
