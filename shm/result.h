// Errors as values (the public types: kvrelay/result.h), and the one helper
// only kvrelay's own code needs.
#pragma once

#include <string_view>

#include "kvrelay/result.h"

namespace kvrelay {

// "what: strerror(errno) (errno N)", for failed system calls.
Error system_error(std::string_view what, int err);

}  // namespace kvrelay
