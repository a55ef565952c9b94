#include "shm/process_logging.h"

#include <fmt/format.h>
#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <filesystem>

namespace kvrelay {

Status setup_logging(const std::string& process, const std::string& log_dir,
                     const std::string& level, const std::string& instance) {
  const spdlog::level::level_enum lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off")
    return make_error(Errc::kInvalidArgument,
                      fmt::format("log level '{}' is not one of trace, debug, info, warn, error, "
                                  "critical, off",
                                  level));
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (!log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(log_dir, ec);
    if (ec)
      return make_error(Errc::kSystem,
                        fmt::format("cannot create log directory {}: {}", log_dir, ec.message()));
    try {
      sinks.push_back(std::make_shared<spdlog::sinks::rotating_file_sink_mt>(
          fmt::format("{}/kvrelay-{}.log", log_dir, process), kLogFileBytes, kLogFiles));
    } catch (const spdlog::spdlog_ex& e) {
      return make_error(Errc::kSystem, fmt::format("cannot open log file: {}", e.what()));
    }
  }
  auto logger = std::make_shared<spdlog::logger>(process, sinks.begin(), sinks.end());
  logger->set_level(lvl);
  // Every line names the instance: several instances often log to one place.
  logger->set_pattern(instance.empty()
                          ? "%Y-%m-%d %H:%M:%S.%e %n[%P] %^%l%$ %v"
                          : fmt::format("%Y-%m-%d %H:%M:%S.%e {} %n[%P] %^%l%$ %v", instance));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return {};
}

}  // namespace kvrelay
