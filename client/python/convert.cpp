#include "convert.h"

#include <fmt/format.h>

#include <cmath>

#include "errors.h"

namespace py = pybind11;

namespace kvrelay::python {

namespace {

// One integer item in [0, max], via __index__ (so numpy integers work and
// floats are refused).
uint64_t to_index(py::handle item, uint64_t max, const char* what, size_t i) {
  PyObject* index = PyNumber_Index(item.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    throw py::type_error(
        fmt::format("{}[{}] is a {}, not an integer", what, i,
                    py::str(py::type::handle_of(item).attr("__name__")).cast<std::string>()));
  }
  const py::object owned = py::reinterpret_steal<py::object>(index);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
  if (overflow != 0 || v < 0 || static_cast<uint64_t>(v) > max)
    raise(Errc::kInvalidArgument, fmt::format("{}[{}] = {} is out of range (0..{})", what, i,
                                              py::str(owned).cast<std::string>(), max));
  return static_cast<uint64_t>(v);
}

template <class T>
std::vector<T> to_list(py::handle values, uint64_t max, const char* what) {
  if (values.is_none()) return {};
  if (py::isinstance<py::str>(values) || py::isinstance<py::bytes>(values) ||
      !py::isinstance<py::iterable>(values))
    throw py::type_error(fmt::format("{} must be a list, tuple, range or array of integers", what));
  std::vector<T> out;
  if (py::hasattr(values, "__len__")) out.reserve(py::len(values));
  size_t i = 0;
  for (py::handle item : values)
    out.push_back(static_cast<T>(to_index(item, max, what, i++)));
  return out;
}

}  // namespace

std::vector<uint32_t> to_u32_list(py::handle values, const char* what) {
  return to_list<uint32_t>(values, UINT32_MAX, what);
}

std::vector<uint16_t> to_port_list(py::handle values, const char* what) {
  return to_list<uint16_t>(values, UINT16_MAX, what);
}

Deadline to_deadline(double timeout_s, const char* what) {
  constexpr double kLongest = 365.0 * 24 * 3600;  // far beyond any sane wait
  if (std::isnan(timeout_s) || timeout_s < 0 || timeout_s > kLongest)
    raise(Errc::kInvalidArgument,
          fmt::format("{} = {} s: a timeout must be between 0 and one year (nothing in kvrelay "
                      "waits forever)",
                      what, timeout_s));
  return Deadline::after(
      std::chrono::nanoseconds(static_cast<int64_t>(std::llround(timeout_s * 1e9))));
}

Protocol to_protocol(const std::string& name) {
  if (name == "ipc") return Protocol::kIpc;
  if (name == "tcp") return Protocol::kTcp;
  if (name == "rdma") return Protocol::kRdma;
  raise(Errc::kInvalidArgument,
        fmt::format("protocol '{}' is not one of 'ipc', 'tcp', 'rdma'", name));
}

std::vector<BatchSlot> to_batch(py::handle slots) {
  if (!py::isinstance<py::iterable>(slots) || py::isinstance<py::str>(slots))
    throw py::type_error(
        "slots must be an iterable of (slot, chunk_token_offset, chunk_len[, request]) tuples");
  std::vector<BatchSlot> out;
  size_t i = 0;
  for (py::handle entry : slots) {
    const std::string what = fmt::format("slots[{}]", i);
    if (!py::isinstance<py::sequence>(entry) || py::isinstance<py::str>(entry))
      throw py::type_error(what +
                           " must be a (slot, chunk_token_offset, chunk_len[, request]) tuple");
    const py::sequence e = py::reinterpret_borrow<py::sequence>(entry);
    const size_t n = py::len(e);
    if (n != 3 && n != 4)
      raise(
          Errc::kInvalidArgument,
          fmt::format("{} has {} items; expected (slot, chunk_token_offset, chunk_len[, request])",
                      what, n));
    BatchSlot s{};
    s.slot = static_cast<uint32_t>(to_index(e[0], UINT32_MAX, what.c_str(), 0));
    s.chunk_token_offset = static_cast<uint32_t>(to_index(e[1], UINT32_MAX, what.c_str(), 1));
    s.chunk_len = static_cast<uint32_t>(to_index(e[2], UINT32_MAX, what.c_str(), 2));
    if (n == 4) {
      const py::object request = e[3];
      if (request.is_none()) {
        s.request_tag = 0;
      } else if (py::isinstance<py::str>(request)) {
        s.request_tag = Client::request_tag(request.cast<std::string>());
      } else {
        s.request_tag = static_cast<uint32_t>(to_index(request, UINT32_MAX, what.c_str(), 3));
      }
    }
    out.push_back(s);
    ++i;
  }
  return out;
}

}  // namespace kvrelay::python
