"""What every reader module shares: a reader's declaration and the reading of a gate on the target.

A reader declares the fact it reads and what it looks at with :func:`reads`, next to its ``def``; a
module's ``READERS`` is then :func:`specs` of its readers for the distribution they read.
:func:`gate_reading` is the reading of a gate that admits the target or not, or whose list could not
be read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from stackforge.core.wheel_readings import CodeSite, ReadContext, Reader, ReaderSpec, Reading, ReadingStatus


class DeclaredReader(Protocol):
    """A reader function that carries its declaration (set by :func:`reads`)."""

    fact: str
    what: str

    def __call__(self, root: Path, ctx: ReadContext, /) -> Reading: ...


def reads(fact: str, what: str) -> Callable[[Reader], DeclaredReader]:
    """Declares the decorated function the reader of ``fact``; ``what`` is one line on what it looks
    at. Only sets the two attributes on the function and returns it unchanged."""

    def declare(reader: Reader) -> DeclaredReader:
        reader.fact = fact  # type: ignore[attr-defined]
        reader.what = what  # type: ignore[attr-defined]
        return reader  # type: ignore[return-value]

    return declare


def specs(dist: str, *readers: DeclaredReader) -> tuple[ReaderSpec, ...]:
    """The registry entries of declared readers of ``dist``'s wheel, in the order given."""
    return tuple(ReaderSpec(reader.fact, dist, reader, reader.what) for reader in readers)


def gate_reading(fact: str, admitted: bool | None, summary: str, sites: tuple[CodeSite, ...],
                 depends_on: tuple[str, ...]) -> Reading:
    """The reading of a gate on the target: AVAILABLE when it admits the target, UNAVAILABLE when it
    refuses it, UNDECIDED when ``admitted`` is None (what the gate lists could not be read)."""
    status = (ReadingStatus.UNDECIDED if admitted is None
              else ReadingStatus.AVAILABLE if admitted else ReadingStatus.UNAVAILABLE)
    return Reading(fact, status, summary, sites, depends_on)
