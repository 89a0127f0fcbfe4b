"""Version selectors: a matrix axis that follows the index instead of listing versions.

    axes:
      sglang: {latest: 3}              # the 3 newest final releases on the index
      flashinfer: {spec: ">=0.7.0"}    # every final release in a range

A selector is data; :func:`choose` applies it to the versions an index lists (final releases only,
never a yanked one). Which versions it chose is written to the matrix's lock file
(:mod:`stackforge.plan.lock`), so a plan is the same offline and tomorrow until the lock is updated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from stackforge.core.errors import SpecError
from stackforge.core.yamlio import describe

#: The distribution each selectable axis follows on the index.
AXIS_DISTS = {"sglang": "sglang", "flashinfer": "flashinfer-python", "torch": "torch"}
#: The most releases ``latest`` may ask for: every chosen release is a stack to build.
MAX_LATEST = 20


@dataclass(frozen=True, slots=True)
class Selector:
    """``{latest: N}`` or ``{spec: ">=0.7.0"}`` on one axis."""

    axis: str
    latest: int | None = None
    spec: str | None = None

    @property
    def dist(self) -> str:
        return AXIS_DISTS[self.axis]

    def text(self) -> str:
        """``latest 3`` / ``spec >=0.7.0``: how the selector reads in messages."""
        return f"latest {self.latest}" if self.latest is not None else f"spec {self.spec}"

    def to_json(self) -> dict[str, Any]:
        return {"latest": self.latest} if self.latest is not None else {"spec": self.spec}


def parse_selector(axis: str, value: Any, *, source: str, line: int) -> Selector:
    """The selector written on ``axis``; a SpecError at ``source:line`` for anything else."""
    if axis not in AXIS_DISTS:
        raise SpecError(f"axis {axis!r} cannot follow the index; selectors are for: {', '.join(AXIS_DISTS)}",
                        source=source, line=line, remedy=f"list {axis} versions instead, e.g. {axis}: [\"...\"]")
    keys = set(value) if isinstance(value, dict) else set()
    if keys == {"latest"}:
        latest = value["latest"]
        if isinstance(latest, bool) or not isinstance(latest, int) or not 1 <= latest <= MAX_LATEST:
            raise SpecError(f"{axis}: latest must be a whole number from 1 to {MAX_LATEST}, got {describe(latest)}",
                            source=source, line=line)
        return Selector(axis, latest=latest)
    if keys == {"spec"}:
        text = value["spec"]
        try:
            SpecifierSet(str(text))
        except InvalidSpecifier:
            raise SpecError(f"{axis}: spec {text!r} is not a PEP 440 version specifier", source=source, line=line,
                            remedy='write it like ">=0.7.0" or ">=0.5.20,<0.6"') from None
        if not isinstance(text, str) or not text.strip():
            raise SpecError(f"{axis}: spec must be a non-empty string", source=source, line=line)
        return Selector(axis, spec=text.strip())
    raise SpecError(f"axis {axis!r} must be a list of versions, {{latest: N}} or {{spec: \"...\"}}, got "
                    f"{describe(value)}", source=source, line=line)


def choose(selector: Selector, available: Sequence[str]) -> tuple[str, ...]:
    """The versions ``selector`` picks from ``available`` (final, unyanked releases), oldest first.

    Raises:
        SpecError: nothing matches (exit 2), naming the selector and what the index has.
    """
    finals = sorted({Version(v) for v in available if _final(v)})
    if selector.latest is not None:
        chosen = finals[-selector.latest:]
    else:
        wanted = SpecifierSet(str(selector.spec))
        chosen = [v for v in finals if wanted.contains(v)]
    if not chosen:
        newest = ", ".join(str(v) for v in finals[-5:]) or "no final release"
        raise SpecError(f"{selector.axis}: {selector.text()} selects nothing on the index ({selector.dist} has: "
                        f"{newest})", remedy="widen the selector, or list versions")
    by_version = {Version(v): v for v in available if _final(v)}
    return tuple(by_version[v] for v in chosen)


def _final(version: str) -> bool:
    try:
        parsed = Version(version)
    except InvalidVersion:
        return False
    return not (parsed.is_prerelease or parsed.is_devrelease)
