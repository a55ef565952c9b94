#include "perftest_baseline.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

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

// The last lines of a program's output, on one line, for an error a user reads.
std::string last_lines(const std::string& output, size_t n = 3) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  if (lines.empty()) return "(no output)";
  return fmt::format("{}", fmt::join(lines.end() - std::min(n, lines.size()), lines.end(), " "));
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
    if (sim::reap_if_exited(*server)) {
      server_reaped = true;
      result = make_error(Errc::kSystem, "the ib_write_bw server exited before its client ran: " +
                                             last_lines(read_all(server_output.get())));
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
                                            r->exit_code, last_lines(r->output)));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // The server ends with its client; one that outlives it by seconds is stuck
  // (SIGTERM: timeout(1) passes it on, and SIGKILLs 5 s later).
  if (!server_reaped) sim::end_child(*server, std::chrono::seconds(10));
  return result;
}

}  // namespace kvrelay::bench
