#include "errors.h"

namespace py = pybind11;

namespace kvrelay::python {

namespace {

struct ErrorTypes {
  PyObject* base = nullptr;  // kvrelay.Error
  PyObject* invalid_argument = nullptr;
  PyObject* ring_full = nullptr;
  PyObject* timeout = nullptr;
  PyObject* coordinator_gone = nullptr;
  PyObject* not_found = nullptr;
  PyObject* aborted = nullptr;
  PyObject* permission_denied = nullptr;
  PyObject* unsupported = nullptr;
};

// Module-lifetime references (the module object keeps them alive too).
ErrorTypes g_errors;

PyObject* make_type(py::module_& m, const char* name, const char* doc, py::tuple bases) {
  const std::string qualified = std::string("kvrelay.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::handle(type));  // steals no reference: keeps one of its own
  return type;
}

}  // namespace

void define_errors(py::module_& m) {
  g_errors.base = make_type(m, "Error", "Base class of every kvrelay error.",
                            py::make_tuple(py::handle(PyExc_Exception)));
  const py::handle base(g_errors.base);
  g_errors.invalid_argument = make_type(m, "InvalidArgument", "Bad input; nothing was submitted.",
                                        py::make_tuple(base, py::handle(PyExc_ValueError)));
  g_errors.ring_full =
      make_type(m, "RingFull", "A ring stayed full until the timeout; nothing was written.",
                py::make_tuple(base));
  g_errors.timeout = make_type(m, "Timeout", "Nothing arrived before the timeout.",
                               py::make_tuple(base, py::handle(PyExc_TimeoutError)));
  g_errors.coordinator_gone = make_type(
      m, "CoordinatorGone",
      "The instance's coordinator died or the instance shut down; attach again once a new "
      "coordinator is up.",
      py::make_tuple(base, py::handle(PyExc_ConnectionError)));
  g_errors.not_found = make_type(m, "NotFound", "No such instance, pool or request.",
                                 py::make_tuple(base, py::handle(PyExc_LookupError)));
  g_errors.aborted =
      make_type(m, "Aborted", "The load waited on failed or was cancelled.", py::make_tuple(base));
  g_errors.permission_denied =
      make_type(m, "PermissionDenied", "The instance's segments belong to another user.",
                py::make_tuple(base, py::handle(PyExc_PermissionError)));
  g_errors.unsupported =
      make_type(m, "Unsupported", "This build or machine cannot do it (no CUDA, no GPU).",
                py::make_tuple(base, py::handle(PyExc_NotImplementedError)));
}

void raise(Errc code, const std::string& message) {
  PyObject* type = g_errors.base;
  switch (code) {
    case Errc::kInvalidArgument:
    case Errc::kTooLarge: type = g_errors.invalid_argument; break;
    case Errc::kFull: type = g_errors.ring_full; break;
    case Errc::kTimeout: type = g_errors.timeout; break;
    case Errc::kCoordinatorGone:
    case Errc::kStale: type = g_errors.coordinator_gone; break;
    case Errc::kNotFound: type = g_errors.not_found; break;
    case Errc::kAborted: type = g_errors.aborted; break;
    case Errc::kPermissionDenied: type = g_errors.permission_denied; break;
    case Errc::kUnsupported: type = g_errors.unsupported; break;
    default: break;
  }
  PyErr_SetString(type, message.c_str());
  throw py::error_already_set();
}

void raise(const Error& error) {
  raise(error.code, error.message);
}

}  // namespace kvrelay::python
