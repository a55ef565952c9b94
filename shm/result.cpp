#include "shm/result.h"

#include <fmt/format.h>

#include <cstring>

namespace kvrelay {

std::string_view errc_name(Errc code) {
  switch (code) {
    case Errc::kOk: return "ok";
    case Errc::kInvalidArgument: return "invalid_argument";
    case Errc::kAlreadyExists: return "already_exists";
    case Errc::kNotFound: return "not_found";
    case Errc::kPermissionDenied: return "permission_denied";
    case Errc::kBadMagic: return "bad_magic";
    case Errc::kVersionMismatch: return "version_mismatch";
    case Errc::kLayoutMismatch: return "layout_mismatch";
    case Errc::kSizeMismatch: return "size_mismatch";
    case Errc::kNotReady: return "not_ready";
    case Errc::kCorrupt: return "corrupt";
    case Errc::kStale: return "stale";
    case Errc::kFull: return "full";
    case Errc::kTimeout: return "timeout";
    case Errc::kAborted: return "aborted";
    case Errc::kTooLarge: return "too_large";
    case Errc::kSystem: return "system";
    case Errc::kCoordinatorGone: return "coordinator_gone";
    case Errc::kBusy: return "busy";
    case Errc::kUnsupported: return "unsupported";
  }
  return "unknown";
}

Error system_error(std::string_view what, int err) {
  return Error{Errc::kSystem, fmt::format("{}: {} (errno {})", what, std::strerror(err), err)};
}

}  // namespace kvrelay
