#include "instance/names.h"

#include <fmt/format.h>

namespace kvrelay {

Status validate_instance_name(std::string_view instance) {
  if (instance.empty())
    return make_error(Errc::kInvalidArgument, "instance name is empty; use [A-Za-z0-9._-]{1,64}");
  if (instance.size() > kMaxInstanceNameBytes)
    return make_error(Errc::kInvalidArgument,
                      fmt::format("instance name is {} characters; at most {} are allowed",
                                  instance.size(), kMaxInstanceNameBytes));
  for (size_t i = 0; i < instance.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(instance[i]);
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      const std::string shown = c >= 0x20 && c < 0x7f ? fmt::format("'{}'", static_cast<char>(c))
                                                      : fmt::format("byte 0x{:02x}", c);
      return make_error(Errc::kInvalidArgument,
                        fmt::format("instance name has {} at position {}; only [A-Za-z0-9._-] "
                                    "are allowed",
                                    shown, i));
    }
  }
  if (instance.front() == '-')
    return make_error(Errc::kInvalidArgument,
                      fmt::format("instance name '{}' may not start with '-' (it would read as a "
                                  "command-line flag)",
                                  instance));
  if (instance.find("..") != std::string_view::npos || instance == ".")
    return make_error(Errc::kInvalidArgument,
                      fmt::format("instance name '{}' may not be '.' or contain '..'", instance));
  return {};
}

std::string control_segment_name(std::string_view instance) {
  return fmt::format("{}{}", kSegmentPrefix, instance);
}

std::string pool_segment_name(std::string_view instance, std::string_view tag, uint32_t rank) {
  return fmt::format("{}{}-{}-r{}", kSegmentPrefix, instance, tag, rank);
}

}  // namespace kvrelay
