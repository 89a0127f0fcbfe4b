"""The import graph of ``stackforge``: no circles, and no module imports a layer above its own.

Read statically (AST) from the source, so every import counts: at module level, inside functions,
and under ``if TYPE_CHECKING``. A type-only import still ties two modules together, and the next
change turns it into a runtime one.

The layer order is declared once, here, bottom first. A module may import its own layer and those
below it. Where the tree breaks the order or closes a circle today, the edge is listed (with why)
in KNOWN_LAYER_VIOLATIONS / KNOWN_CYCLES, so any new one fails, and a fixed one must leave the list.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "stackforge"

#: Bottom first: (layer, module-name prefixes). A prefix covers the module and everything under it.
#: Each layer is one folder of the package, named for its stage, so the order below is also the
#: order in which the folders are read: data flows upwards from ``plan`` to ``ci``.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # stdlib-only code that runs inside images (mounted for every script) or reads their files;
    # imported on the host by the runner, the build's verification, the bench and the wheel readers
    ("inimage", ("stackforge.inimage",)),
    ("core", ("stackforge.core", "stackforge.__init__")),
    ("edges", ("stackforge.edges",)),
    ("plan", ("stackforge.plan",)),
    ("wheels", ("stackforge.wheels",)),
    ("compose", ("stackforge.compose",)),
    ("build", ("stackforge.build",)),
    # one job runner and one campaign skeleton below the probes and the benchmarks
    ("jobs", ("stackforge.jobs",)),
    ("probes", ("stackforge.probes",)),
    ("bench", ("stackforge.bench",)),
    ("results", ("stackforge.results",)),
    ("watch", ("stackforge.watch",)),
    ("report", ("stackforge.report",)),
    ("ci", ("stackforge.ci",)),
    ("doctor", ("stackforge.doctor",)),
    ("cli", ("stackforge.cli", "stackforge.__main__")),
)

#: Edges (importer, imported) that go up a layer today. Each one names its way out.
KNOWN_LAYER_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()

#: Import circles today, each as the set of its modules.
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


# ------------------------------------------------------------------------------------- the graph


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under ``root`` (the package ``package``).

    A package's ``__init__.py`` is the package itself (``stackforge``, ``stackforge.build``).
    """
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module ``name`` lives in: itself, or its nearest enclosing package that exists."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _relative_base(module: str, is_package: bool, level: int) -> str:
    """The package a ``from .x import y`` in ``module`` is relative to."""
    parts = module.split(".")
    if not is_package:
        parts.pop()
    return ".".join(parts[: len(parts) - (level - 1)] if level > 1 else parts)


def imports_of(module: str, path: Path, modules: Mapping[str, Path], package: str) -> set[str]:
    """The package's modules that ``module`` imports anywhere in its source."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(_resolve(alias.name, modules) for alias in node.names
                         if alias.name.split(".")[0] == package)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(filter(None, (_relative_base(module, path.name == "__init__.py", node.level),
                                              node.module)))
            if base.split(".")[0] != package:
                continue
            for alias in node.names:   # `from pkg import sub` imports the submodule when there is one
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in modules else _resolve(base, modules))
    found.discard(None)  # type: ignore[arg-type]
    found.discard(module)
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports."""
    modules = module_files(root, package)
    return {name: imports_of(name, path, modules, package) for name, path in modules.items()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def layer_of(module: str, layers: Sequence[tuple[str, tuple[str, ...]]], package: str) -> int | None:
    """The position of ``module``'s layer (0 = bottom); the longest matching prefix decides."""
    best: tuple[int, int] | None = None
    name = f"{package}.__init__" if module == package else module
    for position, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if name == prefix or name.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), position)
    return None if best is None else best[1]


def upward_edges(graph: Mapping[str, Iterable[str]], layers: Sequence[tuple[str, tuple[str, ...]]],
                 package: str) -> set[tuple[str, str]]:
    """The edges whose imported module sits in a higher layer than its importer."""
    return {(module, imported) for module, targets in graph.items() for imported in targets
            if (layer_of(imported, layers, package) or 0) > (layer_of(module, layers, package) or 0)}


# ------------------------------------------------------------------------------------- the checks


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(PACKAGE_ROOT, "stackforge")


def test_every_module_has_a_layer(graph):
    unplaced = sorted(m for m in graph if layer_of(m, LAYERS, "stackforge") is None)
    assert not unplaced, f"add these modules to a layer in LAYERS: {unplaced}"


def test_no_new_import_circle(graph):
    new = [sorted(c) for c in cycles(graph) if c not in KNOWN_CYCLES]
    assert not new, f"import circles: {new}"


def test_no_module_imports_a_layer_above_its_own(graph):
    new = sorted(upward_edges(graph, LAYERS, "stackforge") - KNOWN_LAYER_VIOLATIONS)
    described = [f"{a} ({LAYERS[layer_of(a, LAYERS, 'stackforge')][0]}) imports "
                 f"{b} ({LAYERS[layer_of(b, LAYERS, 'stackforge')][0]})" for a, b in new]
    assert not described, "imports that go up a layer:\n" + "\n".join(described)


def test_known_violations_are_still_real(graph):
    """A fixed circle or edge leaves the lists, so they never excuse a new one of the same name.

    (An entry whose modules do not all exist is not checked: it speaks of a tree with those modules.)
    """
    present = graph.keys()
    gone_cycles = [sorted(c) for c in KNOWN_CYCLES if c <= present and c not in cycles(graph)]
    gone_edges = sorted(edge for edge in KNOWN_LAYER_VIOLATIONS - upward_edges(graph, LAYERS, "stackforge")
                        if set(edge) <= present)
    assert not gone_cycles and not gone_edges, (f"remove from KNOWN_CYCLES: {gone_cycles}; "
                                                f"from KNOWN_LAYER_VIOLATIONS: {gone_edges}")


def test_the_graph_sees_type_checking_and_function_level_imports(graph):
    # compat_matrix imports the bench catalog inside a function; docker_engine imports registry at the top.
    assert "stackforge.bench.catalog" in graph["stackforge.report.compat_matrix"]
    assert "stackforge.edges.registry" in graph["stackforge.edges.docker_engine"]
    assert "stackforge.build.records" in graph["stackforge.build.progress"]


# ------------------------------------------------------------------- the checks can fail


def _write_package(root: Path, files: Mapping[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


SYNTHETIC_LAYERS = (("low", ("pkg.__init__", "pkg.low")), ("mid", ("pkg.mid",)), ("high", ("pkg.high",)))


def test_a_circle_through_a_type_checking_import_is_found(tmp_path):
    package = _write_package(tmp_path, {
        "__init__.py": "",
        "low.py": "",
        "mid/__init__.py": "",
        "mid/a.py": "from pkg.mid import b\n",
        "mid/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.mid.a import A\n",
        "high.py": "def f():\n    import pkg.low\n",
    })
    graph = import_graph(package, "pkg")
    assert graph["pkg.mid.a"] == {"pkg.mid.b"} and graph["pkg.mid.b"] == {"pkg.mid.a"}
    assert cycles(graph) == [frozenset({"pkg.mid.a", "pkg.mid.b"})]
    assert upward_edges(graph, SYNTHETIC_LAYERS, "pkg") == set()


def test_an_upward_import_inside_a_function_is_found(tmp_path):
    package = _write_package(tmp_path, {
        "__init__.py": "",
        "low.py": "def helper():\n    from pkg.high import thing\n",
        "mid/__init__.py": "from . import x\n",
        "mid/x.py": "from ..low import helper\n",
        "high.py": "from pkg import low\nthing = 1\n",
    })
    graph = import_graph(package, "pkg")
    assert graph["pkg.mid"] == {"pkg.mid.x"} and graph["pkg.mid.x"] == {"pkg.low"}
    assert upward_edges(graph, SYNTHETIC_LAYERS, "pkg") == {("pkg.low", "pkg.high")}
    assert cycles(graph) == [frozenset({"pkg.low", "pkg.high"})]
