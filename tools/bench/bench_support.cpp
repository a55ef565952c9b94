#include "bench_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

namespace kvrelay::bench {

pid_t fork_worker(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  return pid;
}

bool join_worker(pid_t pid, const char* what) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "bench: %s worker failed (status %d)\n", what, status);
    return false;
  }
  return true;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Percentiles percentiles(std::vector<double> s) {
  Percentiles p;
  if (s.empty()) return p;
  std::sort(s.begin(), s.end());
  p.p50 = s[s.size() / 2];
  p.p99 = s[std::min(s.size() - 1, s.size() * 99 / 100)];
  double sum = 0;
  for (double x : s)
    sum += x;
  p.mean = sum / static_cast<double>(s.size());
  return p;
}

void print_header(const std::string& title, const std::string& baseline_name) {
  std::printf("\n== %s\n", title.c_str());
  std::printf("%-44s %14s %14s %9s\n", "case", "kvrelay", baseline_name.c_str(), "ratio");
}

void print_row(const Row& r) {
  std::printf("%-44s %11.2f %-2s %11.2f %-2s %8.2fx\n", r.name.c_str(), r.ours, r.unit.c_str(),
              r.baseline, r.unit.c_str(), r.ratio());
  std::fflush(stdout);
}

void print_target(const std::string& what, bool met, const std::string& detail) {
  std::printf("target %-40s %s  (%s)\n", what.c_str(), met ? "MET" : "MISSED", detail.c_str());
  std::fflush(stdout);
}

}  // namespace kvrelay::bench
