"""Resolve a matrix's selectors and ``derive`` against the package index into its lock file.

The only part of planning that asks the network, and only when told to (``stackforge plan
--update-lock``, ``stackforge watch``). Each selector's distribution is listed afresh (no cached
answer), yanked releases are never chosen (and named when they would have been), and each derived
SGLang release's pins are read from its wheel's core metadata (PEP 658, else HTTP range reads of the
wheel: a few KB, never the whole wheel). Pins already in the old lock for the same file are reused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import requests
from packaging.version import Version

from stackforge.core.errors import SpecError
from stackforge.edges.index import (
    IndexConfig,
    IndexEntry,
    IndexUnreachableError,
    Release,
    new_session,
    release_listing,
    unreachable_cause,
    wheel_metadata,
    with_credentials,
)
from stackforge.plan.lock import (
    LockedAxis,
    LockedPins,
    LockedRelease,
    MatrixLock,
    lock_path_for,
    read_lock,
    write_lock,
)
from stackforge.plan.matrix_file import selectors_of
from stackforge.plan.pins_file import PinsFile
from stackforge.plan.release_pins import pins_from_metadata
from stackforge.plan.selectors import Selector, choose


@dataclass(frozen=True, slots=True)
class LockUpdate:
    """A lock resolved afresh, what changed against the one before, and what the index said besides."""

    lock: MatrixLock
    path: Path
    changes: tuple[str, ...]        # "sglang: + 0.5.24, - 0.5.22" ...; empty when nothing moved
    notes: tuple[str, ...] = ()     # skipped version strings, yanked releases left out
    previous: MatrixLock | None = None

    def text(self) -> str:
        head = (f"{self.path}: {'; '.join(self.changes)}" if self.changes else f"{self.path}: unchanged")
        return "\n".join([head, *(f"  note: {n}" for n in self.notes)])


def update_lock(matrix_path: Path, *, indexes: IndexConfig, until: Mapping[str, str] | None = None,
                write: bool = True, now: datetime | None = None) -> LockUpdate:
    """Resolve ``matrix_path``'s selectors and pins, write its lock (unless ``write`` is false) and say what moved.

    ``until`` (distribution -> version) ignores releases after it: ``stackforge watch --until`` replays history.

    Raises:
        SpecError: the matrix has no selector and no ``derive``; a selector selects nothing (exit 2).
        IndexUnreachableError: the index did not answer (exit 3); the old lock is left as it was.
    """
    selectors, derive_from, listed_sglang = selectors_of(matrix_path)
    path = lock_path_for(matrix_path)
    if not selectors and not derive_from:
        raise SpecError(f"{matrix_path} lists its versions: it has no selector and no derive, so no lock",
                        remedy="write an axis as {latest: N} or {spec: \">=...\"}, or add derive: {from: sglang}")
    previous = read_lock(path) if path.is_file() else None
    session = new_session(indexes)
    notes: list[str] = []
    axes = tuple(_resolve_axis(selector, indexes, session, (until or {}).get(selector.dist), notes)
                 for selector in selectors)
    pins: tuple[LockedPins, ...] = ()
    if derive_from:
        versions = next((a.versions for a in axes if a.selector.axis == "sglang"), listed_sglang)
        listed = release_listing("sglang", indexes=indexes, include_pre=True, include_yanked=True, session=session,
                                 ttl_s=0).releases
        pins = tuple(_pins(version, listed, indexes, session, previous) for version in versions)
    lock = MatrixLock(matrix=matrix_path.name, index=indexes.describe(),
                      resolved_at=(now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                      axes=axes, pins=pins)
    if write:
        write_lock(path, lock)
    return LockUpdate(lock, path, lock_changes(previous, lock), tuple(notes), previous)


def lock_changes(before: MatrixLock | None, after: MatrixLock) -> tuple[str, ...]:
    """What moved between two locks, one line per axis or pinned release (the stacks a build should add)."""
    if before is None:
        return tuple(f"{a.selector.axis}: {a.selector.text()} -> {', '.join(a.versions)} (new lock)"
                     for a in after.axes)
    lines = []
    for axis in after.axes:
        old = before.axis(axis.selector.axis)
        old_versions = old.versions if old else ()
        added = [v for v in axis.versions if v not in old_versions]
        dropped = [v for v in old_versions if v not in axis.versions]
        if added or dropped:
            lines.append(f"{axis.selector.axis}: " + ", ".join([*(f"+ {v}" for v in added),
                                                                 *(f"- {v}" for v in dropped)]))
    for pins in after.pins:
        old_pins = before.pins_of(pins.sglang)
        if old_pins is not None and old_pins.row != pins.row:
            moved = [f"{k} {dict(old_pins.row).get(k)} -> {v}" for k, v in pins.row if dict(old_pins.row).get(k) != v]
            lines.append(f"sglang {pins.sglang} pins: {', '.join(moved)}")
    return tuple(lines)


def _resolve_axis(selector: Selector, indexes: IndexConfig, session: requests.Session, until: str | None,
                  notes: list[str]) -> LockedAxis:
    listing = release_listing(selector.dist, indexes=indexes, include_yanked=True, session=session, ttl_s=0)
    notes += [f"{selector.dist}: {name} skipped: its version is not PEP 440" for name in listing.skipped]
    found = [r for r in listing.releases if until is None or r.parsed <= Version(until)]
    usable = [r for r in found if not r.yanked]
    chosen = choose(selector, [r.version for r in usable])
    newest = Version(chosen[-1])
    notes += [f"{selector.dist} {r.version} is yanked: not chosen" for r in found if r.yanked and r.parsed > newest]
    by_version = {r.version: r for r in usable}
    return LockedAxis(selector, tuple(_locked(by_version[v]) for v in chosen))


def _locked(release: Release) -> LockedRelease:
    return LockedRelease(release.version, release.uploaded,
                         tuple((f.filename, f.sha256) for f in release.files if not f.yanked))


def _pins(version: str, listed: tuple[Release, ...], indexes: IndexConfig, session: requests.Session,
          previous: MatrixLock | None) -> LockedPins:
    """SGLang ``version``'s pins, from the old lock when it read the same file, else from the index."""
    release = next((r for r in listed if r.parsed == Version(version)), None)
    if release is None:
        raise SpecError(f"sglang {version} is not on the index ({indexes.describe()})",
                        remedy="pick a published version")
    pins = read_release_pins(release, indexes, session, previous.pins_of(version) if previous else None)
    if pins is None:
        raise SpecError(f"sglang {version} has no Linux x86_64 or pure-Python wheel to read its pins from")
    return pins


def read_release_pins(release: Release, indexes: IndexConfig, session: requests.Session,
                      known: LockedPins | None = None) -> LockedPins | None:
    """An SGLang release's pins from its wheel's METADATA; ``known`` is reused when it read the same file.
    ``None`` when the release has no wheel to read (an sdist-only release: its PKG-INFO is not what a
    built wheel declares).

    Raises:
        IndexUnreachableError: the file host did not answer (exit 3).
        SpecError: the index serves neither PEP 658 metadata nor range requests (exit 2).
    """
    wheel = _metadata_wheel(release)
    if wheel is None:
        return None
    if known is not None and (known.metadata_file, known.metadata_sha256) == (wheel.filename, wheel.sha256):
        return known
    entry = IndexEntry(wheel.filename, wheel.url, wheel.sha256, core_metadata=wheel.core_metadata)
    try:
        text = wheel_metadata(entry, session=session, url=with_credentials(wheel.url, indexes))
    except (requests.RequestException, OSError, ValueError, KeyError) as exc:
        raise IndexUnreachableError(wheel.url, unreachable_cause(exc, wheel.url)) from None
    if text is None:
        raise SpecError(f"sglang {release.version}: the index serves no metadata for {wheel.filename} and no range "
                        "requests on it", remedy="use an index that serves PEP 658 metadata or range requests")
    return LockedPins(release.version, pins_from_metadata(release.version, text).pins, wheel.filename, wheel.sha256)


def _metadata_wheel(release: Release):
    """The wheel whose METADATA is read: pure Python first, then the Linux x86_64 one for CPython 3.12."""
    def rank(filename: str) -> tuple[int, str]:
        if filename.endswith("-none-any.whl"):
            return (0, filename)
        if "x86_64" in filename and "linux" in filename:
            return (1 if "cp312" in filename else 2, filename)
        return (9, filename)
    wheels = sorted((f for f in release.wheels if not f.yanked), key=lambda f: rank(f.filename))
    return wheels[0] if wheels and rank(wheels[0].filename)[0] < 9 else None


@dataclass(frozen=True, slots=True)
class PinsRefresh:
    """The pins file read afresh from the index, and what moved against the one on disk."""

    pins: PinsFile
    changes: tuple[str, ...]
    notes: tuple[str, ...] = ()


def refresh_pins_file(current: PinsFile, *, indexes: IndexConfig) -> PinsRefresh:
    """Every final SGLang release from ``current.since`` on, its pins read from its wheel's METADATA (rows that
    read the same wheel are reused). Sdist-only releases get no row, and a note.

    Raises:
        IndexUnreachableError: the index did not answer (exit 3).
    """
    session = new_session(indexes)
    listing = release_listing("sglang", indexes=indexes, session=session, ttl_s=0)
    since = Version(current.since)
    rows, notes = [], [f"sglang: {name} skipped: its version is not PEP 440" for name in listing.skipped]
    for release in listing.releases:
        if release.parsed < since or release.yanked:
            continue
        pins = read_release_pins(release, indexes, session, current.row(release.version))
        if pins is None:
            notes.append(f"sglang {release.version}: no wheel (sdist only): no row")
            continue
        rows.append(pins)
    fresh = PinsFile(current.since, indexes.describe(), tuple(rows))
    before, after = current.by_version(), fresh.by_version()
    changes = [f"+ sglang {v}: {', '.join(f'{k} {x}' for k, x in row.items())}" for v, row in after.items()
               if v not in before]
    changes += [f"- sglang {v} (no longer on the index)" for v in before if v not in after]
    changes += [f"~ sglang {v}: " + ", ".join(f"{k} {before[v].get(k)} -> {x}" for k, x in row.items()
                                              if before[v].get(k) != x)
                for v, row in after.items() if v in before and before[v] != row]
    return PinsRefresh(fresh, tuple(changes), tuple(notes))
