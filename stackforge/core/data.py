"""Where the shipped data folders (compat/, matrices/, dockerfiles/) are.

In a wheel they live under ``stackforge/_data/``; in a source checkout they are the top-level
folders of the repository. Callers ask by name and never care which.
"""

from __future__ import annotations

from pathlib import Path

from stackforge.core.errors import StackforgeError

DATA_FOLDERS = ("compat", "matrices", "dockerfiles")


def data_dir(name: str) -> Path:
    """Path of a shipped data folder (``"compat"``, ``"matrices"`` or ``"dockerfiles"``)."""
    if name not in DATA_FOLDERS:
        raise ValueError(f"unknown data folder {name!r}")
    package_dir = Path(__file__).resolve().parent.parent   # stackforge/, above core/
    for candidate in (package_dir / "_data" / name, package_dir.parent / name):
        if candidate.is_dir():
            return candidate
    raise StackforgeError(f"stackforge's {name}/ data folder is missing from this installation",
                          remedy="reinstall stackforge (pip install .)")


def default_matrix_path() -> Path:
    """The shipped default matrix (``matrices/default.yaml``)."""
    return data_dir("matrices") / "default.yaml"


def resolve_matrix_path(value: str | None) -> Path:
    """A ``--matrix`` value: a path, or the name of a shipped matrix (``default`` -> matrices/default.yaml)."""
    if value is None:
        return default_matrix_path()
    path = Path(value)
    if path.exists() or path.suffix in (".yaml", ".yml") or "/" in value:
        return path
    return data_dir("matrices") / f"{value}.yaml"


def display_path(path: Path | str) -> str:
    """A shipped data file as ``compat/rules/x.yaml`` (stable across machines); other paths as given."""
    resolved = Path(path).resolve()
    for name in DATA_FOLDERS:
        try:
            folder = data_dir(name).resolve()
        except StackforgeError:
            continue
        if resolved.is_relative_to(folder):
            return f"{name}/{resolved.relative_to(folder).as_posix()}"
    return str(path)
