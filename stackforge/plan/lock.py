"""A matrix's lock file (``<matrix>.lock.yaml``): what its selectors chose on the index, and the pins it derives.

    schema: 1
    matrix: follow.yaml
    index: https://pypi.org/simple
    resolved_at: "2026-12-02T03:10:00Z"
    axes:
      sglang:
        selector: {latest: 2}
        releases:
          - {version: "0.5.22", uploaded: "2026-10-09T...", files: [{filename: ..., sha256: ...}]}
    pins:                      # derive: {from: sglang}: each release's own Requires-Dist
      "0.5.23": {torch: "2.14.1", flashinfer: "0.7.2", ..., metadata: {file: ..., sha256: ...}}

Written only by ``stackforge plan --update-lock`` (:mod:`stackforge.plan.lock_resolve`); read by every
command that loads the matrix, so a plan is the same offline and tomorrow until the lock is updated.
A lock that is corrupt, or that no longer matches its matrix's selectors, is an error with the
remedy; it is never reset behind the user's back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stackforge.core.errors import SpecError
from stackforge.core.fsio import atomic_write_text
from stackforge.core.yamlio import check_keys, load_file, require_mapping
from stackforge.plan.selectors import Selector, parse_selector

LOCK_SCHEMA = 1
_HEADER = ("# Written by `stackforge plan --update-lock` from the package index; do not edit by hand.\n"
           "# It records what the matrix's selectors chose and the pins each SGLang release declares.\n")


@dataclass(frozen=True, slots=True)
class LockedRelease:
    """One release a selector chose: its version, upload time and files (name, sha256) on the index."""

    version: str
    uploaded: str = ""
    files: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "uploaded": self.uploaded,
                "files": [{"filename": name, "sha256": sha} for name, sha in self.files]}


@dataclass(frozen=True, slots=True)
class LockedAxis:
    """A selector and the releases it chose, oldest first."""

    selector: Selector
    releases: tuple[LockedRelease, ...]

    @property
    def versions(self) -> tuple[str, ...]:
        return tuple(r.version for r in self.releases)


@dataclass(frozen=True, slots=True)
class LockedPins:
    """An SGLang release's pins (a ``sglang_pins`` row) and the metadata file they were read from."""

    sglang: str
    row: tuple[tuple[str, str], ...]
    metadata_file: str = ""
    metadata_sha256: str = ""       # the wheel's sha256 (its METADATA was read from it)

    def as_row(self) -> dict[str, str]:
        return dict(self.row)


@dataclass(frozen=True, slots=True)
class MatrixLock:
    """Everything a matrix's selectors and ``derive`` resolved to, on one index at one time."""

    matrix: str
    index: str
    resolved_at: str
    axes: tuple[LockedAxis, ...] = ()
    pins: tuple[LockedPins, ...] = ()

    def axis(self, name: str) -> LockedAxis | None:
        return next((a for a in self.axes if a.selector.axis == name), None)

    def pins_of(self, sglang: str) -> LockedPins | None:
        return next((p for p in self.pins if p.sglang == sglang), None)

    def to_json(self) -> dict[str, Any]:
        return {"schema": LOCK_SCHEMA, "matrix": self.matrix, "index": self.index, "resolved_at": self.resolved_at,
                "axes": {a.selector.axis: {"selector": a.selector.to_json(),
                                           "releases": [r.to_json() for r in a.releases]} for a in self.axes},
                "pins": {p.sglang: {**p.as_row(), "metadata": {"file": p.metadata_file,
                                                                "sha256": p.metadata_sha256}}
                         for p in self.pins}}


def lock_path_for(matrix_path: Path) -> Path:
    """``matrices/follow.yaml`` -> ``matrices/follow.lock.yaml``."""
    return matrix_path.with_name(f"{matrix_path.stem}.lock.yaml")


def matrix_path_for(lock_path: Path) -> Path:
    """The inverse of :func:`lock_path_for`."""
    return lock_path.with_name(lock_path.name.removesuffix(".lock.yaml") + ".yaml")


def write_lock(path: Path, lock: MatrixLock) -> None:
    """Write the lock atomically (a reader never sees half of it)."""
    atomic_write_text(path, _HEADER + yaml.safe_dump(lock.to_json(), sort_keys=False, width=200))


def read_lock(path: Path) -> MatrixLock:
    """Load a lock file.

    Raises:
        SpecError: missing, unreadable or corrupt (exit 2), with the remedy.
    """
    update = f"`stackforge plan --update-lock --matrix {matrix_path_for(path)}`"
    if not path.is_file():
        raise SpecError(f"the matrix follows the index but has no lock file {path}", remedy=f"write it with {update}")
    remedy = f"restore it from version control, or write it again with {update}"
    try:
        doc = require_mapping(load_file(path), what="lock file", source=str(path))
        check_keys(doc, allowed={"schema", "matrix", "index", "resolved_at", "axes", "pins"}, what="lock file",
                   required={"schema", "axes"})
        if doc["schema"] != LOCK_SCHEMA:
            raise SpecError(f"lock schema {doc['schema']!r}; this stackforge reads schema {LOCK_SCHEMA}",
                            source=str(path), line=doc.line_of("schema"))
        axes = tuple(_axis(str(name), value, str(path))
                     for name, value in require_mapping(doc["axes"], what="axes", source=str(path)).items())
        pins_doc = doc.get("pins")
        pins = () if not pins_doc else tuple(
            _pins(str(version), value, str(path))
            for version, value in require_mapping(pins_doc, what="pins", source=str(path)).items())
    except SpecError as exc:
        raise SpecError(f"corrupt lock file: {exc.one_line()}", remedy=remedy) from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SpecError(f"corrupt lock file {path}: {type(exc).__name__}: {exc}", remedy=remedy) from None
    return MatrixLock(matrix=str(doc.get("matrix", "")), index=str(doc.get("index", "")),
                      resolved_at=str(doc.get("resolved_at", "")), axes=axes, pins=pins)


def _axis(name: str, value: Any, source: str) -> LockedAxis:
    value = require_mapping(value, what=f"axis {name}", source=source)
    selector = parse_selector(name, dict(value["selector"]), source=source, line=value.line_of("selector"))
    releases = tuple(LockedRelease(str(r["version"]), str(r.get("uploaded", "")),
                                   tuple((str(f["filename"]), str(f.get("sha256", ""))) for f in r.get("files") or ()))
                     for r in value["releases"])
    if not releases:
        raise SpecError(f"axis {name} chose no release", source=source, line=value.line)
    return LockedAxis(selector, releases)


def _pins(version: str, value: Any, source: str) -> LockedPins:
    value = require_mapping(value, what=f"pins of sglang {version}", source=source)
    metadata = value.get("metadata") or {}
    row = tuple((str(k), str(v)) for k, v in value.items() if k != "metadata")
    return LockedPins(version, row, str(metadata.get("file", "")), str(metadata.get("sha256", "")))


def check_lock_matches(lock: MatrixLock, selectors: Sequence[Selector], derived_versions: Mapping[str, Sequence[str]],
                       *, path: Path) -> None:
    """The lock must hold every selector as the matrix writes it, and pins for every SGLang version derived.

    Raises:
        SpecError: the matrix changed since the lock was written (exit 2): run --update-lock.
    """
    remedy = f"run `stackforge plan --update-lock --matrix {matrix_path_for(path)}`"
    for selector in selectors:
        locked = lock.axis(selector.axis)
        if locked is None or locked.selector != selector:
            was = locked.selector.text() if locked else "no selector"
            raise SpecError(f"{path.name} is stale: axis {selector.axis} is now '{selector.text()}', the lock chose "
                            f"for '{was}'", remedy=remedy)
    missing = [v for v in derived_versions.get("sglang", ()) if lock.pins_of(v) is None]
    if missing:
        raise SpecError(f"{path.name} has no pins for sglang {', '.join(missing)} (derive: {{from: sglang}})",
                        remedy=remedy)
