// The Python exceptions of the kvrelay module: one class per kind of failure,
// each also a subclass of the builtin a Python caller would catch (Timeout is
// a TimeoutError, InvalidArgument a ValueError, ...), all under kvrelay.Error.
#pragma once

#include <pybind11/pybind11.h>

#include "kvrelay/result.h"

namespace kvrelay::python {

// Creates the exception classes as attributes of `module`.
void define_errors(pybind11::module_& module);

// Raises the exception of `error`'s code with its message. Needs the GIL.
[[noreturn]] void raise(const Error& error);
[[noreturn]] void raise(Errc code, const std::string& message);

// Raises unless `s` is ok.
inline void check(const Status& s) {
  if (!s) raise(s.error());
}

}  // namespace kvrelay::python
