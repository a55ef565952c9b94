// Shared pieces of kvrelay's benchmarks: forking the other side of a
// measurement, collecting samples, and printing "ours vs baseline" rows with
// their ratio, measured in the same run (these machines are shared and noisy,
// so only side-by-side ratios are meaningful).
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kvrelay::bench {

// Forks; the child runs `body` and exits with its result.
pid_t fork_worker(const std::function<int()>& body);
// Waits for a forked worker; returns false (and says so) if it failed.
bool join_worker(pid_t pid, const char* what);

struct Percentiles {
  double p50 = 0, p99 = 0, mean = 0;
};
Percentiles percentiles(std::vector<double> samples);
double median(std::vector<double> v);

// One comparison row: prints a table line and remembers it for the summary.
struct Row {
  std::string name;
  std::string unit;
  double ours = 0;
  double baseline = 0;
  bool higher_is_better = true;
  double ratio() const {
    if (higher_is_better) return baseline > 0 ? ours / baseline : 0;
    return ours > 0 ? baseline / ours : 0;
  }
};

void print_header(const std::string& title, const std::string& baseline_name);
void print_row(const Row& row);
// "target: ..." line, PASS/MISS, honest either way.
void print_target(const std::string& what, bool met, const std::string& detail);
// One point of a curve: recorded for plotting, and printed unless `quiet`
// (when a table row already shows it).
void record_point(const std::string& series, const std::string& x_name, double x,
                  const std::string& y_name, double y, bool quiet = false);
// A line of text for the report (already printed by the caller).
void print_note(const std::string& text);

// The original's control path, rebuilt in Python (manager_baseline.py):
// runs `python script args` and parses its "p50_us=.. p99_us=.." line.
struct PythonBaseline {
  double p50_us = 0, p99_us = 0;
  bool ok = false;
};
PythonBaseline run_python_baseline(const std::string& python, const std::string& script,
                                   const std::string& args);

// When KVRELAY_BENCH_JSON names a file, every header, row, target and point
// is also appended to it as one JSON object per line (tools/bench/run turns
// those lines into the report).

}  // namespace kvrelay::bench
