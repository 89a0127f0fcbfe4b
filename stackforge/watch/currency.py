"""How current a report is: the newest release of each distribution its evidence read, and what the index
had at the last watch.

``matrix``, ``deadends``, ``upgrade`` and ``pick`` answer from results and a plan, never from the network.
This module puts one line beside their answer: the newest release each distribution's evidence comes from
(and when it was read), then, from the watch state in the same results folder
(:mod:`stackforge.watch.state`), any newer release the index had, with the command that reads it. Without
a watch state it says the index was not compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackforge.core.records import ResultRecord
from stackforge.watch.state import WatchState

#: Distributions whose releases the reports' cells depend on, as the records name them.
TRACKED = ("sglang", "flashinfer-python", "sglang-kernel", "sgl-kernel", "torch")
#: Stack keys of a plan that name one of them.
_STACK_KEYS = {"sglang": "sglang", "flashinfer": "flashinfer-python", "torch": "torch"}


@dataclass(frozen=True, slots=True)
class ReadRelease:
    """The newest release of a distribution in the evidence, and when it was read ("" for the plan's pins)."""

    dist: str
    version: str
    read_at: str = ""


@dataclass(frozen=True, slots=True)
class Currency:
    """The newest releases read, and the newer ones the last watch saw on the index."""

    read: tuple[ReadRelease, ...]
    newer: tuple[tuple[str, str, str], ...] = ()     # (dist, version, uploaded)
    watched_at: str = ""                              # "" when the results folder has no watch state
    source: str = "results"                           # results | plan (no results: the matrix's pins)

    def line(self, results: Path) -> str:
        """One line for a person: how current the answer is, and what to run when it is not."""
        what = "results read" if self.source == "results" else "no results; the plan pins"
        read = ", ".join(f"{r.dist} {r.version}" + (f" ({r.read_at[:16]}Z)" if r.read_at else "") for r in self.read)
        head = f"current as of: {read or 'no release read'} [{what}]"
        if not self.watched_at:
            return f"{head}; not compared with the index (`stackforge watch --results {results}` records what it has)"
        if not self.newer:
            return f"{head}; nothing newer on the index at the last watch ({self.watched_at})"
        newer = ", ".join(f"{dist} {version}" + (f" (uploaded {uploaded[:10]})" if uploaded else "")
                          for dist, version, uploaded in self.newer)
        dist = self.newer[0][0]
        base = next(r.version for r in self.read if r.dist == dist)
        return (f"{head}; the index has newer: {newer} (watch of {self.watched_at}): "
                f"`stackforge watch --package {dist} --after {base}` reads what they change")

    def to_json(self) -> dict[str, object]:
        return {"read": [{"package": r.dist, "version": r.version, "read_at": r.read_at} for r in self.read],
                "newer_on_index": [{"package": d, "version": v, "uploaded": u} for d, v, u in self.newer],
                "watched_at": self.watched_at, "source": self.source}


def currency(records: Iterable[ResultRecord], planned_stacks: Iterable[Mapping[str, str]],
             state: WatchState | None) -> Currency:
    """The newest release per tracked distribution in ``records`` (else in the planned stacks), against ``state``."""
    newest: dict[str, ReadRelease] = {}
    for record in records:
        for name, version in record.provenance.versions.items():
            dist = str(canonicalize_name(name))
            if dist in TRACKED and _newer(version, newest.get(dist)):
                newest[dist] = ReadRelease(dist, version, record.created_at)
    source = "results"
    if not newest:
        source = "plan"
        for stack in planned_stacks:
            for key, dist in _STACK_KEYS.items():
                version = stack.get(key)
                if version and _newer(version, newest.get(dist)):
                    newest[dist] = ReadRelease(dist, version)
    read = tuple(newest[d] for d in TRACKED if d in newest)
    if state is None:
        return Currency(read, source=source)
    newer = tuple((dist, seen.version, seen.uploaded) for dist, seen in sorted(state.seen.items())
                  if dist in newest and _newer(seen.version, newest[dist]))
    return Currency(read, newer, state.checked_at or "unknown time", source)


def _newer(version: str, than: ReadRelease | None) -> bool:
    try:
        return than is None or Version(version) > Version(than.version)
    except InvalidVersion:
        return False
