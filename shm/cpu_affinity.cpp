#include "shm/cpu_affinity.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace kvrelay {

namespace {

bool parse_int(std::string_view s, int& out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && out >= 0;
}

}  // namespace

Result<std::vector<int>> parse_cpu_list(std::string_view text) {
  std::vector<int> cpus;
  auto bad = [&](std::string_view why) {
    return make_error(Errc::kInvalidArgument,
                      fmt::format("--cpu-list '{}': {} (expected e.g. 2-5,8)", text, why));
  };
  if (text.empty()) return bad("empty");
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item = text.substr(at, comma - at);
    const size_t dash = item.find('-');
    int first = 0, last = 0;
    if (!parse_int(item.substr(0, dash), first) ||
        (dash != std::string_view::npos && !parse_int(item.substr(dash + 1), last)))
      return bad(fmt::format("'{}' is not a CPU or a range of CPUs", item));
    if (dash == std::string_view::npos) last = first;
    if (last < first) return bad(fmt::format("the range '{}' runs backwards", item));
    if (last >= CPU_SETSIZE) return bad(fmt::format("CPU {} is beyond {}", last, CPU_SETSIZE - 1));
    for (int c = first; c <= last; ++c) {
      if (std::find(cpus.begin(), cpus.end(), c) != cpus.end())
        return bad(fmt::format("CPU {} is listed twice", c));
      cpus.push_back(c);
    }
    at = comma + 1;
  }
  return cpus;
}

Status pin_to_cpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("cannot pin to CPU {}: {}", cpu, std::strerror(errno)));
  return {};
}

Status place_process(IdleStrategy idle, const std::vector<int>& cpus, uint32_t process_index) {
  set_idle_strategy(idle);
  if (cpus.empty()) return {};
  return pin_to_cpu(cpus[process_index % cpus.size()]);
}

}  // namespace kvrelay
