"""One meaning per word, in the code's own names: no two classes of the package share a name (a reader
finds a class by its name, and two of them would mean two things), in-image scripts included."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

PACKAGE = Path(__file__).resolve().parents[1] / "stackforge"


def test_no_two_classes_share_a_name():
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(path.relative_to(PACKAGE).as_posix())
    shared = {name: files for name, files in where.items() if len(files) > 1}
    assert not shared, shared
