"""The README's plain ``pip install .`` brings everything stackforge imports on the host.

A module imported only inside a function (``testinfra`` in verification) fails at run time, not at
import, so this reads every import statement of the package, wherever it stands, and checks that a
core dependency provides it (itself or through its own requirements). The core dependencies are read
from the installed stackforge's metadata, which is what pip made of pyproject.toml (scripts/test.sh
reinstalls it on every run). The scripts under ``*/scripts/`` and the modules of ``inimage/`` run inside
images and are not the host's concern (``inimage`` imports the standard library only).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "stackforge"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def core_requirements() -> list[Requirement]:
    """What a plain ``pip install .`` installs: the requirements that no extra guards."""
    environment = {**default_environment(), "extra": ""}
    requirements = [Requirement(line) for line in importlib.metadata.requires("stackforge") or []]
    return [r for r in requirements if r.marker is None or r.marker.evaluate(environment)]


def installed_closure(requirements: list[Requirement]) -> set[str]:
    """The distributions the requirements pull in (installed here), their own requirements included."""
    environment = {**default_environment(), "extra": ""}
    seen: set[str] = set()
    pending = [r for r in requirements if r.marker is None or r.marker.evaluate(environment)]
    while pending:
        requirement = pending.pop()
        name = _normal(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        for line in importlib.metadata.requires(requirement.name) or []:
            nested = Requirement(line)
            if nested.marker is None or nested.marker.evaluate(environment):
                pending.append(nested)
    return seen


def host_imports() -> dict[str, set[str]]:
    """Top-level module -> the package files (outside the in-image scripts) that import it."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if "scripts" in relative.parts or (relative.parts[0] == "inimage" and relative.name.startswith("_")):
            continue   # in-image code: standard library only (tests/test_inimage.py)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                found.setdefault(module.split(".")[0], set()).add(str(relative))
    return {m: files for m, files in found.items() if m not in sys.stdlib_module_names and m != "stackforge"}


def test_every_host_import_comes_with_the_core_dependencies():
    closure = installed_closure(core_requirements())
    providers = importlib.metadata.packages_distributions()
    imports = host_imports()
    assert "testinfra" in imports   # the verification's import is seen, although it sits in a function
    missing = {module: sorted(files) for module, files in imports.items()
               if not {_normal(d) for d in providers.get(module, [])} & closure}
    assert not missing, f"imported but not installed by `pip install .` (add to [project] dependencies): " \
                        f"{missing}"


def test_verification_needs_no_extra():
    names = {_normal(r.name) for r in core_requirements()}
    assert {"pytest", "pytest-testinfra"} <= names
    extras = importlib.metadata.metadata("stackforge").get_all("Provides-Extra") or []
    assert "verify" not in extras and "test" in extras
