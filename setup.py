"""Builds the `kvrelay` Python module (client/python) with the project's
CMake, against the Python that runs this (a venv's or conda's, not only
Debian's), and installs it with its type stubs as a PEP 561 stub package
(`kvrelay-stubs`) so that mypy finds them in an installed environment.

Only the module's target is built. KVRELAY_CMAKE_ARGS adds CMake arguments
(e.g. -DKVRELAY_CUDA=OFF); the build needs what tools/setup.sh installs
(a compiler, CMake, Ninja, pybind11, Cap'n Proto, spdlog, the CUDA toolkit
where CUDA is wanted)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def project_version() -> str:
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(kvrelay VERSION (\S+)", text).group(1)


class CMakeModule(Extension):
    def __init__(self) -> None:
        super().__init__("kvrelay", sources=[])


class BuildWithCMake(build_ext):
    def build_extension(self, ext: Extension) -> None:
        build = Path(self.build_temp).resolve() / "cmake"
        configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja",
                     "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_TESTING=OFF",
                     "-DKVRELAY_BENCHMARKS=OFF", "-DKVRELAY_PYTHON=ON",
                     f"-DPython3_EXECUTABLE={sys.executable}",
                     *shlex.split(os.environ.get("KVRELAY_CMAKE_ARGS", ""))]
        subprocess.run(configure, check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "kvrelay_python"], check=True)
        built = next((build / "python").glob("kvrelay*.so"))
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)


setup(
    version=project_version(),
    ext_modules=[CMakeModule()],
    cmdclass={"build_ext": BuildWithCMake},
    # The stubs as the package `kvrelay-stubs` (PEP 561: a single-file
    # extension module cannot carry a py.typed marker itself); its
    # __init__.pyi is a link to client/python/kvrelay.pyi.
    packages=["kvrelay-stubs"],
    package_dir={"kvrelay-stubs": "client/python/kvrelay-stubs"},
    package_data={"kvrelay-stubs": ["__init__.pyi"]},
    zip_safe=False,
)
