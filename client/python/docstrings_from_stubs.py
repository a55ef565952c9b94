"""Writes the compiled module's runtime docstrings from its stubs.

    docstrings_from_stubs.py kvrelay.pyi out.inc

The stubs (kvrelay.pyi) are the one place the Python API is documented;
this turns the docstrings of the module, its classes and their members into
C++ initialisers, {"Class", "member", "doc"}, that docstrings.cpp attaches at
import, so that help(kvrelay.Client) says what the stubs say. A class's own
docstring has member ""; the module's has class "" and member "".
"""

from __future__ import annotations

import ast
import sys


def entries(tree: ast.Module):
    doc = ast.get_docstring(tree, clean=True)
    if doc:
        yield "", "", doc
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        doc = ast.get_docstring(node, clean=True)
        if doc:
            yield node.name, "", doc
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(item, clean=True)
                if doc:
                    yield node.name, item.name, doc


def literal(text: str) -> str:
    assert ")kvdoc\"" not in text
    return f'R"kvdoc({text})kvdoc"'


def main() -> None:
    source, out = sys.argv[1], sys.argv[2]
    with open(source, encoding="utf-8") as f:
        tree = ast.parse(f.read(), source)
    lines = [f"// Generated from {source.rsplit('/', 1)[-1]} by docstrings_from_stubs.py: do not edit."]
    seen = set()
    for cls, member, doc in entries(tree):
        if (cls, member) in seen:  # a property's setter after its getter, say: the first wins
            continue
        seen.add((cls, member))
        lines.append(f'{{"{cls}", "{member}", {literal(doc)}}},')
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
