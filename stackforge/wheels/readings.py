"""The wheel readings ``compat verify`` uses: releases listed from the configured indexes (pip's own
configuration, or ``--index-url`` / ``--find-links``), wheels fetched into the wheel cache and read by
the registered readers. The edge of :mod:`stackforge.wheels.verify`, which only sees the two callables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stackforge.core.errors import SpecError
from stackforge.core.wheel_readings import ReadContext, Reading, ReadingStatus
from stackforge.edges.index import IndexConfig, Release, find_release, index_config, releases
from stackforge.wheels.cache import WheelCache
from stackforge.wheels.tier import measure


@dataclass(slots=True)
class WheelReadings:
    """Lists releases once per distribution and reads one release's wheel for a fact and a context."""

    indexes: IndexConfig
    cache: WheelCache
    found: dict[str, list[Release]] = field(default_factory=dict)

    def list_releases(self, dist: str) -> list[str]:
        """Final, non-yanked releases, oldest first."""
        return [r.version for r in self._releases(dist)]

    def evaluate(self, fact: str, dist: str, version: str, ctx: ReadContext) -> Reading:
        from stackforge.wheels.readers import reader_for

        try:
            spec = reader_for(fact, dist)
        except SpecError as exc:   # a witness whose reader is not registered: nothing decides the rule
            return Reading(fact, ReadingStatus.UNDECIDED, exc.one_line())
        release = find_release(self._releases(dist), version)
        if release is None:   # the lister gave this version, so it is on the index
            raise AssertionError(f"{dist} {version} not among the listed releases")
        return measure(spec, release, ctx, cache=self.cache).reading

    def _releases(self, dist: str) -> list[Release]:
        if dist not in self.found:
            self.found[dist] = releases(dist, indexes=self.indexes, session=self.cache.session,
                                        cache_dir=self.cache.index_dir)
        return self.found[dist]


def open_readings(*, index_url: str | None = None, find_links: Sequence[str] = (),
                  cache_root: Path | None = None) -> WheelReadings:
    """Readings from the indexes pip would ask here (command-line values first) into the wheel cache."""
    from stackforge.edges.pip_config import read_pip_config

    indexes = index_config(index_url=index_url, find_links=find_links, pip_config=read_pip_config())
    return WheelReadings(indexes=indexes, cache=WheelCache.open(indexes, cache_root))
