#include "bench_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace kvrelay::bench {

namespace {

std::string g_suite;  // the title of the last header

std::string quoted(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + '"';
}

// Appends one JSON object (given as its members) to $KVRELAY_BENCH_JSON; with
// the value "-", prints it on stdout after "@bench-json " instead (a
// benchmark run inside tools/rxe-vm, whose files stay in the guest).
void emit_json(const std::string& members) {
  const char* path = std::getenv("KVRELAY_BENCH_JSON");
  if (path == nullptr || *path == '\0') return;
  if (std::string(path) == "-") {
    std::printf("@bench-json {\"suite\": %s, %s}\n", quoted(g_suite).c_str(), members.c_str());
    std::fflush(stdout);
    return;
  }
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "{\"suite\": %s, %s}\n", quoted(g_suite).c_str(), members.c_str());
    std::fclose(f);
  }
}

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

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
  g_suite = title;
  std::printf("\n== %s\n", title.c_str());
  std::printf("%-44s %14s %14s %9s\n", "case", "kvrelay", baseline_name.c_str(), "ratio");
}

void print_row(const Row& r) {
  std::printf("%-44s %11.2f %-2s %11.2f %-2s %8.2fx\n", r.name.c_str(), r.ours, r.unit.c_str(),
              r.baseline, r.unit.c_str(), r.ratio());
  std::fflush(stdout);
  emit_json("\"type\": \"row\", \"case\": " + quoted(r.name) + ", \"unit\": " + quoted(r.unit) +
            ", \"ours\": " + number(r.ours) + ", \"baseline\": " + number(r.baseline) +
            ", \"ratio\": " + number(r.ratio()) +
            ", \"higher_is_better\": " + (r.higher_is_better ? "true" : "false"));
}

void print_target(const std::string& what, bool met, const std::string& detail) {
  std::printf("target %-40s %s  (%s)\n", what.c_str(), met ? "MET" : "MISSED", detail.c_str());
  std::fflush(stdout);
  emit_json("\"type\": \"target\", \"what\": " + quoted(what) +
            ", \"met\": " + (met ? "true" : "false") + ", \"detail\": " + quoted(detail));
}

void print_note(const std::string& text) {
  emit_json("\"type\": \"note\", \"text\": " + quoted(text));
}

void record_point(const std::string& series, const std::string& x_name, double x,
                  const std::string& y_name, double y, bool quiet) {
  if (!quiet)
    std::printf("%-28s %s=%-8s %s=%s\n", series.c_str(), x_name.c_str(), number(x).c_str(),
                y_name.c_str(), number(y).c_str());
  std::fflush(stdout);
  emit_json("\"type\": \"point\", \"series\": " + quoted(series) +
            ", \"x_name\": " + quoted(x_name) + ", \"x\": " + number(x) +
            ", \"y_name\": " + quoted(y_name) + ", \"y\": " + number(y));
}

PythonBaseline run_python_baseline(const std::string& python, const std::string& script,
                                   const std::string& args) {
  PythonBaseline b;
  if (script.empty()) return b;
  const std::string cmd = "'" + python + "' '" + script + "' " + args;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return b;
  std::array<char, 512> line{};
  while (std::fgets(line.data(), line.size(), p) != nullptr) {
    if (std::sscanf(line.data(), "p50_us=%lf p99_us=%lf", &b.p50_us, &b.p99_us) == 2) b.ok = true;
  }
  if (pclose(p) != 0) b.ok = false;
  if (!b.ok) std::fprintf(stderr, "bench: the baseline '%s' failed\n", cmd.c_str());
  return b;
}

}  // namespace kvrelay::bench
