"""Where a reading's verdict changes across the releases of a distribution (pure search logic).

The search is given the releases in version order and a callback that reads one release; it never
touches the network itself, so it is tested with a plain function. A release the callback cannot
decide (an sdist-only release, a reader that gives up) is stepped over, like ``git bisect skip``,
and named between the two releases it sits between.

* :func:`binary_search` assumes the verdict changed once: it reads both ends (the first and the last
  release it can decide) and halves the range
  between every two neighbouring readings that disagree. When the ends agree it first reads a few
  releases spread over the range (a gate that appeared and later widened gives ends that agree);
  a change between two of those samples that agree back is still missed, which ``--all`` is for.
* :func:`full_scan` reads every release and reports every change: a history that is not monotone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from stackforge.core.wheel_readings import CodeSite, Reading, ReadingStatus, ReleaseFile

#: Releases read across the range when its two ends agree (besides the ends).
SAMPLES_WHEN_ENDS_AGREE = 6


class HasReading(Protocol):
    @property
    def reading(self) -> Reading: ...


class ReleaseReading(Protocol):
    """What the search reports on: a reading and the wheel it was read from (``None``: no wheel)."""

    @property
    def reading(self) -> Reading: ...

    @property
    def file(self) -> ReleaseFile | None: ...


T = TypeVar("T", bound=HasReading)


@dataclass(frozen=True, slots=True)
class Point(Generic[T]):
    """One release read: its position in the release list, its version, what the callback returned."""

    index: int
    version: str
    result: T

    @property
    def status(self) -> ReadingStatus:
        return self.result.reading.status

    @property
    def decided(self) -> bool:
        return self.status is not ReadingStatus.UNDECIDED

    @property
    def verdict(self) -> tuple[ReadingStatus, str]:
        """What is compared between releases: the status, and the manner the code decides it in."""
        return (self.status, self.result.reading.manner)

    @property
    def verdict_text(self) -> str:
        manner = self.result.reading.manner
        return f"{self.status.value}: {manner}" if manner else self.status.value


@dataclass(frozen=True, slots=True)
class Change(Generic[T]):
    """The verdict differs between two neighbouring decided readings.

    ``undecided`` are the releases between them that were read but could not be decided; when it is
    empty, ``before`` and ``after`` are consecutive releases and the boundary is exact.
    """

    before: Point[T]
    after: Point[T]
    undecided: tuple[Point[T], ...] = ()


@dataclass(frozen=True, slots=True)
class Search(Generic[T]):
    """What a search read and where it found the verdict changing."""

    versions: tuple[str, ...]
    points: tuple[Point[T], ...]           # every release read, in version order
    changes: tuple[Change[T], ...]
    exhaustive: bool                       # every release was read (--all)

    @property
    def undecided(self) -> tuple[Point[T], ...]:
        return tuple(p for p in self.points if not p.decided)


def binary_search(versions: Sequence[str], read: Callable[[str], T], *,
                  on_read: Callable[[Point[T]], None] | None = None,
                  samples: int = SAMPLES_WHEN_ENDS_AGREE) -> Search[T]:
    """Find the release(s) where the verdict changes, reading as few releases as it can."""
    points: dict[int, Point[T]] = {}

    def visit(index: int) -> Point[T]:
        if index not in points:
            points[index] = Point(index, versions[index], read(versions[index]))
            if on_read is not None:
                on_read(points[index])
        return points[index]

    if not versions:
        return Search((), (), (), exhaustive=True)
    # The ends are the first and the last release that can be decided (old releases are often sdists).
    first = next((p for p in map(visit, range(len(versions))) if p.decided), None)
    last = next((p for p in map(visit, range(len(versions) - 1, first.index, -1)) if p.decided), None) \
        if first is not None else None
    if first is not None and last is not None and first.verdict == last.verdict:
        for index in _spread(last.index - first.index + 1, samples):
            visit(first.index + index)
    while (gap := _next_gap(versions, points)) is not None:
        visit(gap)
    ordered = tuple(points[i] for i in sorted(points))
    return Search(tuple(versions), ordered, _changes(ordered), exhaustive=len(points) == len(versions))


def full_scan(versions: Sequence[str], read: Callable[[str], T], *,
              on_read: Callable[[Point[T]], None] | None = None) -> Search[T]:
    """Read every release; every change, in order."""
    ordered = []
    for index, version in enumerate(versions):
        point = Point(index, version, read(version))
        if on_read is not None:
            on_read(point)
        ordered.append(point)
    return Search(tuple(versions), tuple(ordered), _changes(tuple(ordered)), exhaustive=True)


def _spread(count: int, samples: int) -> list[int]:
    """``samples`` indexes spread evenly strictly between the first and the last."""
    inner = count - 2
    if inner <= samples:
        return list(range(1, count - 1))
    return sorted({1 + round(k * (inner - 1) / (samples - 1)) for k in range(samples)})


def _next_gap(versions: Sequence[str], points: dict[int, Point[T]]) -> int | None:
    """The release to read next: the middle unread one between two neighbouring decided readings that
    disagree; ``None`` once every such pair has nothing unread between them."""
    decided = [points[i] for i in sorted(points) if points[i].decided]
    for before, after in zip(decided, decided[1:]):
        if before.verdict == after.verdict:
            continue
        unread = [i for i in range(before.index + 1, after.index) if i not in points]
        if unread:
            middle = (before.index + after.index) / 2
            return min(unread, key=lambda i: (abs(i - middle), i))
    return None


def _changes(ordered: tuple[Point[T], ...]) -> tuple[Change[T], ...]:
    changes = []
    previous: Point[T] | None = None
    between: list[Point[T]] = []
    for point in ordered:
        if not point.decided:
            between.append(point)
            continue
        if previous is not None and previous.verdict != point.verdict:
            changes.append(Change(previous, point, tuple(between)))
        previous, between = point, []
    return tuple(changes)


# --- what a search found, as text and JSON ----------------------------------------------------------

def site_text(site: CodeSite, *, sep: str = ": ") -> str:
    """``path:line: code``; ``path: not in this release`` for a file's absence (line 0)."""
    if site.line == 0:
        return f"{site.path}: not in this release" if not site.code else f"{site.path}: {site.code}"
    return f"{site.path}:{site.line}{sep}{site.code}"


def headline(dist: str, change: Change[ReleaseReading]) -> str:
    """``flashinfer-python 0.6.16.post4 <path:line code> -> 0.6.17 <path:line code>``: on each side the
    first code line that differs between the two readings (the line the verdict turned on)."""
    before, after = change.before.result.reading.sites, change.after.result.reading.sites
    differing = next((i for i, (b, a) in enumerate(zip(before, after)) if b.code != a.code), None)

    def side(point: Point[ReleaseReading], sites: tuple) -> str:
        if not sites:
            return f"{point.version} ({point.verdict_text}) {point.result.reading.summary}"
        site = sites[min(differing, len(sites) - 1)] if differing is not None else sites[-1]
        return f"{point.version} ({point.verdict_text}) {site_text(site, sep=' ')}"
    skipped = (f" [undecided between: {', '.join(p.version for p in change.undecided)}]"
               if change.undecided else "")
    return f"{dist} {side(change.before, before)} -> {side(change.after, after)}{skipped}"


def write_search(search: Search[ReleaseReading], *, fact: str, dist: str, target: str, context: str) -> str:
    """The search as text: what was searched, each change with the evidence on both sides."""
    how = "every release read (--all)" if search.exhaustive else "binary search"
    span = f"{search.versions[0]} .. {search.versions[-1]}" if search.versions else "none"
    lines = [f"{fact} ({dist}) on {target} ({context}): {len(search.versions)} release(s) {span}; "
             f"{len(search.points)} read, {how}"]
    if not search.changes:
        decided = {p.verdict_text for p in search.points if p.decided}
        verdict = ", ".join(sorted(decided)) or "undecided"
        lines.append(f"no change found: every release read says {verdict}"
                     + ("" if search.exhaustive else " (binary search assumes one change; --all reads every "
                                                     "release)"))
    for change in search.changes:
        lines += ["", headline(dist, change)]
        for point in (change.before, *change.undecided, change.after):
            lines += _evidence_lines(point)
    undecided = [p for p in search.undecided if not any(p in c.undecided for c in search.changes)]
    if undecided:
        lines += ["", "undecided: " + "; ".join(_undecided_groups(undecided))]
    return "\n".join(lines)


def _undecided_groups(points: Sequence[Point[ReleaseReading]]) -> list[str]:
    """``31 release(s) 0.2.0.post1 .. 0.4.1: sdist only: not built``: undecided releases by reason."""
    by_reason: dict[str, list[str]] = {}
    for point in points:
        by_reason.setdefault(point.result.reading.summary, []).append(point.version)
    return [f"{versions[0]} ({reason})" if len(versions) == 1 else
            f"{len(versions)} releases {versions[0]} .. {versions[-1]} ({reason})"
            for reason, versions in by_reason.items()]


def _evidence_lines(point: Point[ReleaseReading]) -> list[str]:
    reading, file = point.result.reading, point.result.file
    lines = [f"  {point.version}: {point.verdict_text}: {reading.summary}"]
    lines += [f"      {site_text(site)}" for site in reading.sites]
    if file is not None:
        lines.append(f"      {file.kind}: {file.url} sha256:{file.sha256 or 'not given by the index'} "
                     f"(index {file.index})")
    return lines


def search_json(search: Search[ReleaseReading], *, dist: str) -> dict[str, Any]:
    """One distribution's search for ``--json``."""
    return {"package": dist, "mode": "all" if search.exhaustive else "binary", "releases": list(search.versions),
            "read": [_point_json(p) for p in search.points],
            "changes": [{"before": _point_json(c.before), "after": _point_json(c.after),
                         "undecided_between": [p.version for p in c.undecided]} for c in search.changes]}


def _point_json(point: Point[ReleaseReading]) -> dict[str, Any]:
    reading, file = point.result.reading, point.result.file
    return {"version": point.version, "status": point.status.value, "manner": reading.manner,
            "summary": reading.summary,
            "sites": [{"path": s.path, "line": s.line, "code": s.code} for s in reading.sites],
            "depends_on": list(reading.depends_on),
            "wheel": None if file is None else {"filename": file.filename, "url": file.url, "sha256": file.sha256,
                                                "index": file.index}}
