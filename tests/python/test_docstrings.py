"""help(kvrelay.Client) documents the API: every public member of the
module's classes has the stubs' docstring at runtime, after its signature."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kvrelay

STUBS = Path(__file__).resolve().parents[2] / "client" / "python" / "kvrelay.pyi"
CLASSES = ["Client", "Pool", "Completion", "Error", "InvalidArgument", "Timeout", "CoordinatorGone"]


def stub_docs() -> dict[tuple[str, str], str]:
    docs = {}
    for node in ast.parse(STUBS.read_text()).body:
        if isinstance(node, ast.ClassDef):
            docs[(node.name, "")] = ast.get_docstring(node) or ""
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    docs.setdefault((node.name, item.name), ast.get_docstring(item) or "")
    return docs


@pytest.mark.parametrize("cls", CLASSES)
def test_every_public_member_has_the_stubs_docstring(cls):
    docs = stub_docs()
    assert getattr(kvrelay, cls).__doc__ == docs[(cls, "")]
    undocumented = []
    klass = getattr(kvrelay, cls)
    for name in vars(klass):
        if name.startswith("_"):
            continue
        want = docs.get((cls, name), "")
        got = getattr(getattr(klass, name), "__doc__", None) or ""
        if not want or want not in got:
            undocumented.append(name)
    assert undocumented == [], f"kvrelay.{cls}: no docstring (in kvrelay.pyi) for {undocumented}"


def test_a_method_keeps_its_signature_above_the_text():
    doc = kvrelay.Client.submit_swap.__doc__
    assert doc.startswith("submit_swap(self: kvrelay.Client, request_id: str, direction: str"), doc
    assert "direction 'evict' (device -> host)" in doc


def test_the_module_docstring_states_the_contract():
    assert "exactly one completion per request" in kvrelay.__doc__
