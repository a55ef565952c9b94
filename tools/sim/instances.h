// Starting and stopping the two kvrelay instances kvrelay-sim drives, when it
// is asked to start them itself (--start).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "shm/result.h"

namespace kvrelay::sim {

struct Geometry {
  uint32_t tp = 2;
  uint32_t layers = 32;
  uint32_t extra_layers = 0;
  uint32_t blocks = 512;
  uint32_t block_size = 64;
  uint32_t kv_heads = 1;
  uint32_t head_dim = 128;
  std::string dtype = "bfloat16";
  uint32_t host_blocks = 0;
  bool k_only = false;  // no V: an MLA latent cache (--k-only)
};

class ManagedInstance {
 public:
  ManagedInstance() = default;
  ManagedInstance(const ManagedInstance&) = delete;
  ManagedInstance& operator=(const ManagedInstance&) = delete;
  ~ManagedInstance();
  // Starts kvrelay-coordinator (next to this executable) for `name`.
  // `extra`: more coordinator flags (the tcp transport's).
  Status start(const std::string& name, const std::string& role, const Geometry& g,
               const std::string& log_dir, const std::string& log_level,
               const std::vector<std::string>& extra = {});
  // SIGTERM and wait; returns the exit code (-1 if it had to be killed).
  int stop();

 private:
  pid_t pid_ = -1;
};

std::string binary_next_to_me(const std::string& program);


}  // namespace kvrelay::sim
