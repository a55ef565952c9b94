#include "docstrings.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace py = pybind11;

namespace kvrelay::python {

namespace {

struct Doc {
  const char* cls;     // "" : the module
  const char* member;  // "" : the class (or module) itself
  const char* text;
};

constexpr Doc kDocs[] = {
#include "kvrelay_docstrings.inc"
};

// A pybind11 function keeps its docstring in its PyMethodDef, malloc'd
// (pybind11 frees and replaces it the same way when it adds an overload).
// Keep the signature lines pybind11 wrote and put the stubs' text after them.
void set_function_doc(PyObject* function, const char* text) {
  auto* f = reinterpret_cast<PyCFunctionObject*>(function);
  std::string doc = f->m_ml->ml_doc != nullptr ? f->m_ml->ml_doc : "";
  if (const size_t blank = doc.find("\n\n"); blank != std::string::npos) doc.resize(blank);
  while (!doc.empty() && doc.back() == '\n') doc.pop_back();
  doc += doc.empty() ? "" : "\n\n";
  doc += text;
  std::free(const_cast<char*>(f->m_ml->ml_doc));
  f->m_ml->ml_doc = strdup(doc.c_str());
}

void set_member_doc(py::handle owner, const char* member, const char* text) {
  py::dict attrs = owner.attr("__dict__");
  if (!attrs.contains(member))
    throw py::import_error(std::string("kvrelay.pyi documents ") +
                           py::str(owner.attr("__name__")).cast<std::string>() + "." + member +
                           ", which the module lacks");
  PyObject* raw = py::object(attrs[member]).ptr();
  if (PyInstanceMethod_Check(raw)) raw = PyInstanceMethod_Function(raw);
  if (py::isinstance(raw, py::module_::import("builtins").attr("staticmethod")))
    raw = py::handle(raw).attr("__func__").ptr();
  if (PyCFunction_Check(raw)) {
    set_function_doc(raw, text);
    return;
  }
  py::handle(raw).attr("__doc__") = text;  // a property (pybind11 makes builtins.property)
}

}  // namespace

void attach_docstrings(py::module_& m) {
  for (const Doc& d : kDocs) {
    if (*d.cls == '\0') {
      m.doc() = d.text;
      continue;
    }
    py::object owner = m.attr(d.cls);
    if (*d.member == '\0')
      owner.attr("__doc__") = d.text;
    else
      set_member_doc(owner, d.member, d.text);
  }
}

}  // namespace kvrelay::python
