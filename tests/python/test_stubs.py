"""The type stubs (kvrelay.pyi) describe the module as built: every public
name and method in one is in the other."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import kvrelay

STUB = Path(kvrelay.__file__).with_name("kvrelay.pyi")


def stub_names():
    tree = ast.parse(STUB.read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = {n.name for n in node.body
                                if isinstance(n, ast.FunctionDef) and
                                (not n.name.startswith("_") or n.name in
                                 ("__init__", "__enter__", "__exit__"))}
        elif isinstance(node, (ast.AnnAssign)) and isinstance(node.target, ast.Name):
            names[node.target.id] = None
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                names[t.id] = None
    return names


def test_every_stubbed_name_exists_in_the_module():
    for name, members in stub_names().items():
        if name in ("BlockIds", "BatchEntry"):
            continue  # typing aliases, stub-only
        assert hasattr(kvrelay, name), name
        for m in members or ():
            assert hasattr(getattr(kvrelay, name), m), f"{name}.{m}"


def test_every_public_name_of_the_module_is_stubbed():
    stubs = stub_names()
    for name, obj in vars(kvrelay).items():
        if name.startswith("_") and name != "__version__":
            continue
        assert name in stubs, f"kvrelay.{name} is missing from kvrelay.pyi"
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            public = {m for m in vars(obj) if not m.startswith("_")}
            assert public <= stubs[name], f"{name}: {public - stubs[name]} not in kvrelay.pyi"
