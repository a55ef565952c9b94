// The command-line conventions every kvrelay program keeps, so that scripts
// and units can rely on them: --version prints "<program> <version>" and
// exits 0, --help exits 0, and a usage error says why on stderr and exits 2
// (CLI11's own codes, 105-109, are no convention anyone scripts against).
//
//   CLI::App app{"..."};
//   kvrelay::add_version_flag(app, "kvrelay-dump");
//   ...
//   KVRELAY_PARSE_COMMAND_LINE(app, argc, argv);
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

namespace kvrelay {

inline constexpr int kExitUsage = 2;

// The project's version (CMakeLists.txt's), e.g. "0.1.0".
const char* version();

inline void add_version_flag(CLI::App& app, const std::string& program) {
  app.set_version_flag("--version", program + " " + version(), "print the version and exit");
}

// nullopt: parsed, carry on; else the status to exit with (help and version
// already printed, or the usage error).
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    (void)app.exit(e);  // prints the error and the --help hint
    return kExitUsage;
  }
}

}  // namespace kvrelay

#define KVRELAY_PARSE_COMMAND_LINE(app, argc, argv)             \
  if (const std::optional<int> kvrelay_exit_ =                  \
          ::kvrelay::parse_command_line((app), (argc), (argv))) \
  return *kvrelay_exit_
