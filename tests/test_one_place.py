"""Each edge of the host package has one place: processes, containers, atomic writes, schema envelopes,
and how a JSON document is laid out (indented: stored documents and printed reports).

Scanned as syntax (calls and imports, not text), over every host module; the in-image scripts
(``probes/scripts``, ``bench/scripts`` and the modules of ``inimage``) run inside containers with the standard library only and are
left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "stackforge"
IN_IMAGE = ("probes/scripts", "bench/scripts", "inimage/_")


def host_modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if not relative.startswith(IN_IMAGE):
            found[relative] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return found


def called_attributes(tree: ast.Module) -> set[str]:
    """``a.b.c(...)`` calls as ``b.c`` (the last two names), and plain ``f(...)`` calls as ``f``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                owner = func.value.attr if isinstance(func.value, ast.Attribute) else getattr(func.value, "id", "")
                names.add(f"{owner}.{func.attr}")
            elif isinstance(func, ast.Name):
                names.add(func.id)
    return names


def imported_modules(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def indented_json_dumps(tree: ast.Module) -> bool:
    """A ``json.dumps(..., indent=...)`` call: the layout of a document someone reads or diffs."""
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "dumps"
               and getattr(node.func.value, "id", "") == "json" and any(k.arg == "indent" for k in node.keywords)
               for node in ast.walk(tree))


def defined_functions(tree: ast.Module) -> set[str]:
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


@pytest.fixture(scope="module")
def modules() -> dict[str, ast.Module]:
    return host_modules()


@pytest.mark.parametrize(("what", "where", "uses"), [
    ("an atomic replace", "core/fsio.py", lambda tree: "os.replace" in called_attributes(tree)),
    ("a subprocess", "edges/runner.py", lambda tree: "subprocess" in imported_modules(tree)),
    ("a container", "edges/docker_engine.py",
     lambda tree: bool({"containers.create", "containers.run"} & called_attributes(tree))),
    ("a schema envelope check", "core/envelope.py", lambda tree: "check_envelope" in defined_functions(tree)),
    ("an indented JSON layout", "core/envelope.py", indented_json_dumps),
])
def test_only_one_module_does_it(modules, what, where, uses):
    doing = sorted(name for name, tree in modules.items() if uses(tree))
    assert doing == [where], f"{what} belongs in {where} only; found in {doing}"


def test_the_scan_sees_what_it_looks_for():
    """The checks above would pass vacuously if the scan missed the calls; one of each must be seen."""
    tree = ast.parse("import os, subprocess\nos.replace(a, b)\nclient.containers.create(x)\n"
                     "json.dumps(doc, indent=2)\ndef check_envelope():\n    pass\n")
    assert {"os.replace", "containers.create"} <= called_attributes(tree)
    assert "subprocess" in imported_modules(tree)
    assert "check_envelope" in defined_functions(tree)
    assert indented_json_dumps(tree) and not indented_json_dumps(ast.parse("json.dumps(doc)"))
