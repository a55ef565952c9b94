// kvrelay-coordinator: see coordinator.h.
#include <fmt/format.h>

#include "coordinator/coordinator.h"
#include "shm/command_line.h"

int main(int argc, char** argv) {
  auto options = kvrelay::coordinator::parse_options(argc, argv);
  if (!options) {
    // kNotFound: --help or --version, printed as asked; else a usage error.
    const bool help = options.code() == kvrelay::Errc::kNotFound;
    fmt::print(help ? stdout : stderr, "{}{}\n",
               help ? "" : "kvrelay-coordinator: ", options.error().message);
    return help ? 0 : kvrelay::kExitUsage;
  }
  return kvrelay::coordinator::run_coordinator(*options);
}
