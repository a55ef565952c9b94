// Errors as values: every failure that crosses a process boundary carries a
// code a program can branch on and a message a person can act on.
//
// Part of kvrelay's public face (self-contained: the standard library only).
// kvrelay's own code uses these same types, so nothing is converted at the
// boundary.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kvrelay {

enum class Errc : uint16_t {
  kOk = 0,
  kInvalidArgument,   // a caller passed something impossible (bad name, bad size)
  kAlreadyExists,     // a live owner already holds the thing we tried to create
  kNotFound,          // no such segment / instance / request
  kPermissionDenied,  // owner uid or mode refuses us
  kBadMagic,          // not a kvrelay segment at all
  kVersionMismatch,   // a kvrelay segment from another layout version
  kLayoutMismatch,    // same version, different struct layout (different build)
  kSizeMismatch,      // segment size disagrees with its header or configuration
  kNotReady,          // segment exists but its creator has not published it yet
  kCorrupt,           // a field read from shared memory is out of its legal range
  kStale,             // left behind by a dead creator
  kFull,              // a ring has no room; nothing was overwritten
  kTimeout,           // a deadline passed
  kAborted,           // a barrier round was poisoned because a participant died
  kTooLarge,          // a record exceeds the ring's record limit
  kSystem,            // an OS call failed; the message names it and errno
  kCoordinatorGone,   // the instance's coordinator died (or the instance shut down)
  kBusy,              // a live process holds what we asked for (a producer slot, a rank)
  kUnsupported,       // this build or machine cannot do it (no CUDA, no GPU, a driver too old)
};

std::string_view errc_name(Errc code);

struct Error {
  Errc code = Errc::kOk;
  std::string message;
};

// A value or an Error. Small on purpose: C++20 has no std::expected.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

  const Error& error() const { return std::get<1>(v_); }
  Errc code() const { return ok() ? Errc::kOk : error().code; }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return error_.code == Errc::kOk; }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return error_; }
  Errc code() const { return error_.code; }

 private:
  Error error_;
};

using Status = Result<void>;

inline Error make_error(Errc code, std::string message) {
  return Error{code, std::move(message)};
}

}  // namespace kvrelay
