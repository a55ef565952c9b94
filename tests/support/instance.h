// A real kvrelay instance for tests: kvrelay-coordinator started with
// fork/exec (and, through it, its kvrelay-worker processes), a Client
// attached to it, and a clean stop that checks nothing was left in /dev/shm.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "kvrelay/client.h"

namespace kvrelay::testing {

struct InstanceArgs {
  std::string instance;
  std::string role = "mixed";
  uint32_t tp = 1;
  uint32_t layers = 4;
  uint32_t blocks = 64;
  uint32_t host_blocks = 0;
  uint32_t block_size = 16;
  uint32_t kv_heads = 1;
  uint32_t head_dim = 32;
  std::string dtype = "bfloat16";
  uint32_t extra_layers = 0;
  uint32_t deadline_ms = 30'000;
  bool external_workers = false;
  std::vector<std::string> extra;  // more flags
  // Runs the coordinator under this command (e.g. `ip netns exec NS`, which
  // execs it: the pid stays the coordinator's).
  std::vector<std::string> prefix;
};

class Instance {
 public:
  // Starts the coordinator and waits until the instance is ready.
  static std::unique_ptr<Instance> start(
      const InstanceArgs& args, std::chrono::milliseconds ready_within = std::chrono::seconds(30));
  ~Instance();  // SIGKILLs whatever is left and removes its segments

  Client& client() { return *client_; }
  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  // SIGTERM, then waits for the coordinator's exit code (-1 on timeout).
  int stop(std::chrono::milliseconds within = std::chrono::seconds(30));
  void kill9();
  // Names of /dev/shm entries that belong to this instance.
  std::vector<std::string> leftover_segments() const;

  static std::string bin(const std::string& program);  // build/<preset>/bin/<program>

 private:
  std::string name_;
  pid_t pid_ = -1;
  std::unique_ptr<Client> client_;
};

// Runs `program args...`, waits for it (up to `within`), returns its exit
// code and captures stdout+stderr into `output`.
int run_program(const std::vector<std::string>& argv, std::string* output,
                std::chrono::milliseconds within = std::chrono::seconds(30));

// Starts `program args...` in the background; returns its pid.
pid_t spawn_program(const std::vector<std::string>& argv);

// The pid in `instance`'s worker slot for `rank` (0 when the segment is gone).
uint32_t worker_pid(const std::string& instance, uint32_t rank);

}  // namespace kvrelay::testing
