// When a GPU test may skip. Without a GPU it says why and skips, except
// where a GPU must be there: wherever `nvidia-smi -L` lists one (a skip
// there is a broken driver or runtime, not a CPU machine), and wherever
// KVRELAY_REQUIRE_GPU=1 is set (tools/gpu-check sets it, so that a run on
// the device machine where nothing ran cannot report success). Then it
// fails, with the runtime's and the driver's CUDA versions.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "shm/result.h"

namespace kvrelay::testing {

// "runtime 13.0, driver 12.8" (a driver number of 0: no driver loaded).
inline std::string cuda_versions() {
  int runtime = 0, driver = 0;
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cudaDriverGetVersion(&driver);
  (void)cudaGetLastError();
  return "CUDA runtime " + std::to_string(runtime / 1000) + "." +
         std::to_string(runtime % 1000 / 10) + ", driver supports " +
         std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10);
}

// `s`'s message, with the versions unless it says them already.
inline std::string with_cuda_versions(const Status& s) {
  const std::string& m = s.error().message;
  return m.find("CUDA runtime") != std::string::npos ? m : m + " (" + cuda_versions() + ")";
}

// Why a skip would be a failure here, or "" where skipping is right.
inline const std::string& gpu_required_because() {
  static const std::string why = [] {
    if (const char* v = std::getenv("KVRELAY_REQUIRE_GPU"); v != nullptr && std::strcmp(v, "1") == 0)
      return std::string("KVRELAY_REQUIRE_GPU=1 is set");
    std::string listed;
    if (FILE* p = ::popen("nvidia-smi -L 2>/dev/null", "r")) {
      char line[256];
      while (std::fgets(line, sizeof(line), p) != nullptr) listed += line;
      (void)::pclose(p);
    }
    if (listed.rfind("GPU ", 0) == 0)
      return "nvidia-smi lists " + listed.substr(0, listed.find('\n'));
    return std::string();
  }();
  return why;
}

}  // namespace kvrelay::testing
