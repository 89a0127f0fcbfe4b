"""Comments and docs cite only what a reader can open: files of this repository or public references.

Notes kept outside the repository (a research write-up, a design document, a shared folder) are not
something a reader of the code can open, so a citation of one fails here. (The sources of compat
rules are checked more strictly in ``test_compat_data.py``.)
"""

from __future__ import annotations

import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("stackforge", "tests", "docs", "scripts", "benchmarks", "compat", "matrices", "dockerfiles", "README.md")
SUFFIXES = {".py", ".sh", ".md", ".yaml", ".yml", ".toml", ".j2", ".Dockerfile", ".txt", ""}
#: Citations of files that are not in this repository.
OUTSIDE = re.compile(r"research/[\w.-]+|compat_facts\.md|\bDESIGN\.md\b|docs/DESIGN\b|\bshared/[\w.-]+")
#: Files that hold these markers as test data, not as citations.
MARKERS_AS_DATA = {"tests/test_citations.py", "tests/test_compat_data.py"}
#: Citations known today, in files being changed elsewhere: (file, the citation).
KNOWN = {("matrices/default.yaml", "shared/seed")}


def _files() -> list[Path]:
    found = []
    for name in SCANNED:
        path = REPO_ROOT / name
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        found += [p for p in candidates if p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    return found


def citations_outside(text: str) -> list[str]:
    """The citations in ``text`` of files that are not in this repository."""
    return OUTSIDE.findall(text)


def test_no_citation_of_a_file_outside_the_repository():
    found = set()
    for path in _files():
        relative = path.relative_to(REPO_ROOT).as_posix()
        if relative in MARKERS_AS_DATA:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        found |= {(relative, cited) for cited in citations_outside(text)}
    assert not found - KNOWN, f"cite a file of this repository or a public reference instead: {sorted(found - KNOWN)}"


def test_the_check_finds_such_citations():
    assert citations_outside("# see research/compat_facts.md §4h") == ["research/compat_facts.md"]
    assert citations_outside("(stackforge DESIGN.md 'Base flavours')") == ["DESIGN.md"]
    assert citations_outside("see docs/DESIGN \"Development\"") == ["docs/DESIGN"]
    assert citations_outside("# The situation in shared/seed: ...") == ["shared/seed"]
    assert citations_outside("see docs/scale-out.md and tests/_session.py") == []
