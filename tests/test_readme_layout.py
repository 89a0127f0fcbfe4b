"""The layout table of docs/architecture.md ("How it is built", linked from the README) names every part
of the package, so a newcomer finds each module or folder of ``stackforge/`` from the documentation;
the README stays short enough to read (at most 250 lines) and links every page under docs/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layout_section() -> str:
    return (ROOT / "docs" / "architecture.md").read_text()


def test_the_readme_fits_and_links_every_docs_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert [p for p in pages if f"docs/{p}" not in readme] == []


def package_parts() -> list[str]:
    """Top-level modules (``plan``) and folders (``build/``) of the package."""
    parts = []
    for path in sorted((ROOT / "stackforge").iterdir()):
        if path.name.startswith(("__", ".")):
            continue
        if path.suffix == ".py":
            parts.append(path.name)
        elif path.is_dir():
            parts.append(path.name + "/")
    return parts


def test_every_module_and_folder_of_the_package_is_in_the_readme_layout() -> None:
    section = layout_section()
    missing = [part for part in package_parts() if not re.search(r"\b" + re.escape(part), section)]
    assert not missing, f"add to the table of docs/architecture.md: {missing}"


def test_every_path_the_layout_names_exists() -> None:
    named = set(re.findall(r"`(stackforge/[\w/.]+)`", layout_section()))
    absent = sorted(p for p in named if not (ROOT / p).exists())
    assert not absent, f"docs/architecture.md names paths that are not in the tree: {absent}"


def test_the_top_level_holds_stage_folders_only() -> None:
    """Each stage is a folder; no module sits beside them at the top of the package."""
    modules = sorted(p.name for p in (ROOT / "stackforge").glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not modules, f"move into the folder of their stage: {modules}"


def test_the_layout_table_lists_the_folders_in_import_order() -> None:
    """The table reads bottom to top in the layer order that tests/test_import_graph.py enforces."""
    from test_import_graph import LAYERS

    layer_folders = [prefixes[0].split(".")[1] for _, prefixes in LAYERS]
    table_folders = [f for f in re.findall(r"^\| `stackforge/(\w+)/` \|", layout_section(), re.M)
                     if f != "schemas"]
    assert table_folders == layer_folders, (table_folders, layer_folders)
