"""Deterministic sharding of a matrix: ``--shard K/N`` runs the K-th of N disjoint parts.

A stack's shard depends on its id alone (SHA-256 of the id, modulo N), so every machine that
sees the same stack ids agrees on the split without talking to the others, and the union of the
N shards is the whole matrix with no stack in two shards. Python's ``hash()`` is not used: it is
salted per process (PYTHONHASHSEED), so two CI jobs would disagree.

Because membership depends only on the id, a stack keeps its shard when other stacks are added
or removed (its build cache and logs stay on the same shard night after night). The price is
that small matrices can split unevenly; :func:`nonempty_shards` lets CI skip empty shards.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from stackforge.core.errors import SpecError

T = TypeVar("T")

_SHARD_TEXT = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")
# More shards than this is a typo, not a plan (and keeps error messages and CI matrices sane).
MAX_SHARDS = 256


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` of ``total`` (1-based, as written on the command line: ``2/4``)."""

    index: int
    total: int

    def __post_init__(self) -> None:
        for name, value in (("index", self.index), ("total", self.total)):
            # bool is an int subclass; Shard(True, 2) is a bug, not shard 1.
            if not isinstance(value, int) or isinstance(value, bool):
                raise SpecError(f"shard {name} must be an integer, got {value!r}")
        if not 1 <= self.total <= MAX_SHARDS:
            raise SpecError(f"shard count must be between 1 and {MAX_SHARDS}, got {self.total}")
        if not 1 <= self.index <= self.total:
            raise SpecError(f"shard {self.index}/{self.total} does not exist: "
                            f"K must be between 1 and {self.total}",
                            remedy="shards are numbered from 1, e.g. --shard 1/4 ... --shard 4/4")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"2/4"`` -> ``Shard(2, 4)``; anything else is a :class:`SpecError` that says what is expected."""
        match = _SHARD_TEXT.fullmatch(str(text))
        if match is None:
            raise SpecError(f"shard {str(text)!r} is not of the form K/N (e.g. 2/4)",
                            remedy="pass --shard K/N with whole numbers, 1 <= K <= N")
        return cls(int(match.group(1)), int(match.group(2)))

    @classmethod
    def all_of(cls, total: int) -> tuple[Shard, ...]:
        """Every shard of a ``total``-way split, in order: ``1/N ... N/N``."""
        return tuple(cls(index, total) for index in range(1, total + 1))

    def __str__(self) -> str:
        return f"{self.index}/{self.total}"

    @property
    def slug(self) -> str:
        """``"2-of-4"``: the shard in a form allowed in file and artifact names (no ``/``)."""
        return f"{self.index}-of-{self.total}"

    def owns(self, key: str) -> bool:
        """True when the item whose key is ``key`` belongs to this shard."""
        return shard_index(key, self.total) == self.index


def shard_index(key: str, total: int) -> int:
    """The 1-based shard of ``key`` in a ``total``-way split (stable across processes and machines)."""
    if total < 1:
        raise SpecError(f"shard count must be at least 1, got {total}")
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    # 64 bits of the digest: plenty of spread for any N we allow, and cheap.
    return int.from_bytes(digest[:8], "big") % total + 1


def _stack_id(item: Any) -> str:
    return item.id


def select(items: Iterable[T], shard: Shard | None, key: Callable[[T], str] = _stack_id) -> tuple[T, ...]:
    """The items of ``shard``, in their original order; ``None`` means no sharding (all items).

    Args:
        items: stacks (or anything ``key`` maps to a stable string id).
        shard: which shard to keep.
        key: the id an item is sharded by; defaults to ``item.id`` (a :class:`~stackforge.core.model.Stack`).
    """
    if shard is None:
        return tuple(items)
    return tuple(item for item in items if shard.owns(key(item)))


def split(items: Iterable[T], total: int, key: Callable[[T], str] = _stack_id) -> tuple[tuple[T, ...], ...]:
    """All ``total`` shards at once: element ``i`` holds the items of shard ``i + 1``."""
    buckets: list[list[T]] = [[] for _ in range(total)]
    for item in items:
        buckets[shard_index(key(item), total) - 1].append(item)
    return tuple(tuple(bucket) for bucket in buckets)


def nonempty_shards(keys: Iterable[str], total: int) -> tuple[Shard, ...]:
    """The shards of a ``total``-way split that own at least one of ``keys`` (so CI starts no idle jobs)."""
    used = {shard_index(key, total) for key in keys}
    return tuple(shard for shard in Shard.all_of(total) if shard.index in used)


def click_shard_option(*param_decls: str, help_text: str | None = None) -> Callable[[Any], Any]:
    """A click ``--shard K/N`` option whose value arrives as a :class:`Shard` (or ``None``).

    A malformed value becomes click's usage error (exit status 2) with the :class:`SpecError` text.
    Usage::

        @click.command()
        @click_shard_option()
        def command(shard: Shard | None) -> None: ...
    """
    import click  # imported here so the pure core above never needs click

    class ShardParamType(click.ParamType):
        name = "K/N"

        def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Shard:
            if isinstance(value, Shard):
                return value
            try:
                return Shard.parse(value)
            except SpecError as exc:
                self.fail(exc.one_line(), param, ctx)

    return click.option(*(param_decls or ("--shard", "shard")), type=ShardParamType(), default=None,
                        metavar="K/N",
                        help=help_text or "Run only shard K of N (split by stack id; e.g. 2/4).")
