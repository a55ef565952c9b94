// The wording both halves of validation share (validate.cpp for tasks,
// validate_pool.cpp for RegisterPool): one kind of error, and counts that
// read as English.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <string>
#include <utility>

#include "shm/result.h"

namespace kvrelay::messages::detail {

inline Error invalid(std::string text) {
  return make_error(Errc::kInvalidArgument, std::move(text));
}

// "1 entry", "3 entries".
inline std::string entries(size_t n) {
  return fmt::format("{} {}", n, n == 1 ? "entry" : "entries");
}

}  // namespace kvrelay::messages::detail
