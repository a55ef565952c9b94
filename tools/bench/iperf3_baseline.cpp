#include "iperf3_baseline.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "programs.h"
#include "shm/spawn.h"
#include "shm/unique_fd.h"

namespace kvrelay::bench {
namespace {

// A port free on `address` when that address is this namespace's own (the
// loopback fallback); inside a fresh namespace nothing else listens, so
// iperf3's own default serves.
uint16_t pick_port(const std::string& address) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  socklen_t len = sizeof(a);
  if (fd.get() >= 0 && ::inet_pton(AF_INET, address.c_str(), &a.sin_addr) == 1 &&
      ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) == 0)
    return ntohs(a.sin_port);
  return 5201;
}

}  // namespace

Iperf3Result run_iperf3(const sim::TwoHosts& hosts, uint32_t streams, int seconds) {
  const std::optional<std::string> iperf3 = sim::find_program("iperf3");
  if (!iperf3) return {0, "iperf3 is not installed (tools/setup.sh installs it)"};
  const std::string port = std::to_string(pick_port(hosts.address_b()));

  std::vector<std::string> server = hosts.on_b();  // empty in the loopback fallback
  server.insert(server.end(), {*iperf3, "-s", "-1", "-B", hosts.address_b(), "-p", port});
  UniqueFd devnull(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  SpawnOptions o;
  o.die_with_parent = true;
  o.output_fd = devnull.get();
  Result<pid_t> server_pid = spawn_process(server, o);
  if (!server_pid) return {0, "cannot start the iperf3 server: " + server_pid.error().message};

  std::vector<std::string> client = hosts.on_a();
  client.insert(client.end(), {*iperf3, "-c", hosts.address_b(), "-p", port, "-P",
                               std::to_string(streams), "-t", std::to_string(seconds), "-J"});
  Iperf3Result result{0, "the iperf3 server did not accept a client within 5 s"};
  // The server takes a moment to listen: a refused client exits at once and
  // never counts as the server's one client.
  bool server_reaped = false;
  for (int attempt = 0; attempt < 50; ++attempt) {
    if (sim::reap_if_exited(*server_pid)) {
      server_reaped = true;
      break;
    }
    const Result<sim::ProgramRun> run = sim::run_program(client);
    const nlohmann::json j = nlohmann::json::parse(run ? run->output : "", nullptr, false);
    if (!j.is_discarded() && j.contains("end") && j["end"].contains("sum_received")) {
      result = {j["end"]["sum_received"].value("bits_per_second", 0.0) / 8e9, ""};
      break;
    }
    if (!j.is_discarded() && j.contains("error"))
      result.why_not = "iperf3: " + j.value("error", std::string("failed"));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!server_reaped) sim::end_child(*server_pid, std::chrono::milliseconds(0));
  return result;
}

}  // namespace kvrelay::bench
