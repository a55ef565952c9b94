// Runtime docstrings for the module, its classes and their members, taken
// from the stubs (kvrelay.pyi, through docstrings_from_stubs.py at build
// time): the stubs are the one place the Python API is documented, and
// help(kvrelay.Client) shows the same text as an editor reading the stubs.
#pragma once

#include <pybind11/pybind11.h>

namespace kvrelay::python {

// Called once the module's classes are defined. A member the stubs document
// but the module lacks is a build error's worth: it throws (ImportError).
void attach_docstrings(pybind11::module_& m);

}  // namespace kvrelay::python
