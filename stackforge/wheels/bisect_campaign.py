"""What ``stackforge bisect`` does: search each distribution a feature is read from, and record the reads.

:func:`run_bisect_campaign` takes one :class:`BisectRequest` (what the command was asked) and returns a
:class:`BisectOutcome`: one search per distribution (:func:`stackforge.wheels.tier.run_bisect`), the
distributions that could not be searched, and, when a store is given, the run every release read was
recorded in as a wheel-tier result. With ``through_pins`` (:func:`run_pin_bisect`) it searches SGLang's releases
instead, each judged with its own pins (:mod:`stackforge.wheels.pin_effects`).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from stackforge.core.errors import SpecError
from stackforge.core.records import RunStore
from stackforge.core.wheel_readings import ReadContext
from stackforge.edges.index import IndexRequest, configured_indexes
from stackforge.plan.planner import load_knowledge
from stackforge.plan.user_compat import UserCompat
from stackforge.wheels.bisect import Point, write_search, search_json
from stackforge.wheels.cache import WheelCache
from stackforge.wheels.tier import (
    Measurement,
    ReleaseRange,
    load_readers,
    resolve_specs,
    run_bisect,
    target_context,
    target_named,
    wheel_record,
)

__all__ = ["BisectOutcome", "BisectRequest", "IndexRequest", "ReleaseRange", "run_bisect_campaign", "run_pin_bisect"]


@dataclass(frozen=True, slots=True)
class BisectRequest:
    """One ``stackforge bisect`` run.

    Attributes:
        feature: the feature or fact to search (``flashinfer-ar-fusion``).
        target: the target profile whose arch, GPU count and interconnect the readers judge for.
        package: only this distribution, when several are read for the feature.
        span: the releases read; a ``first``/``last`` bound only with one distribution.
        exhaustive: read every release (a history that is not monotone) instead of bisecting.
        cuda, python, torch_cuda, kernel_package: the stack's values, for facts that depend on them.
        through_pins: search SGLang's releases, each judged with its own pins of torch, FlashInfer and the kernel
            (rules and readers, :mod:`stackforge.wheels.pin_effects`); ``target`` may then be empty (every
            known target), ``cuda`` is required, ``flavours`` narrows devel / wheels (default both).
    """

    feature: str
    target: str
    package: str | None = None
    span: ReleaseRange = ReleaseRange()
    exhaustive: bool = False
    cuda: str | None = None
    python: str | None = None
    torch_cuda: str | None = None
    kernel_package: str | None = None
    index: IndexRequest = IndexRequest()
    through_pins: bool = False
    flavours: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BisectOutcome:
    """The searches of one bisect run, as text and JSON, and what could not be searched."""

    feature: str
    target: str
    context: dict[str, Any]        # the read context, without the fields nobody set
    texts: tuple[str, ...]
    searches: tuple[dict[str, Any], ...]
    not_searched: tuple[str, ...]  # one line per distribution the indexes do not have
    recorded: int = 0              # wheel-tier records written
    run_dir: Path | None = None    # where they were written

    def text(self) -> str:
        return "\n\n".join([*self.texts, *(f"not searched: {line}" for line in self.not_searched)])

    def to_json(self) -> dict[str, Any]:
        return {"feature": self.feature, "target": self.target, "context": self.context,
                "searches": list(self.searches), "not_searched": list(self.not_searched)}


def run_bisect_campaign(request: BisectRequest, *, user: UserCompat | None = None, store: RunStore | None = None,
                        on_read: Callable[[str, Point[Measurement]], None] = lambda dist, point: None
                        ) -> BisectOutcome:
    """Search every distribution the request's feature is read from; record each release read in a
    new run of ``store`` when one is given.

    Raises:
        SpecError: unknown feature, target or distribution; --from/--to with several distributions;
            no distribution could be searched (exit 2).
        IndexUnreachableError: an index or a file host did not answer (exit 3).
    """
    if request.through_pins:
        return run_pin_bisect(request, user=user, on_read=on_read)
    if not request.target:
        raise SpecError("bisect needs --target NAME", remedy="name a target (`stackforge list targets`); only "
                                                              "--through-pins defaults to every target")
    specs = resolve_specs(load_readers(), request.feature, request.package)
    if len(specs) > 1 and (request.span.first or request.span.last):
        raise SpecError(f"--from/--to take versions of one distribution, and {request.feature} is read from "
                        f"several: {', '.join(spec.dist for spec in specs)}", remedy="add --package DIST")
    target = target_named(load_knowledge(user=user).targets, request.target)
    ctx = _read_context(target, request)
    indexes = configured_indexes(request.index)
    cache = WheelCache.open(indexes)
    context = _context_words(target, request)
    searches, texts, missing, measured = [], [], [], []
    for spec in specs:
        try:
            search = run_bisect(spec, ctx, indexes=indexes, cache=cache, span=request.span,
                                exhaustive=request.exhaustive, on_read=lambda point, dist=spec.dist: on_read(dist, point))
        except SpecError as exc:
            if len(specs) == 1:
                raise
            missing.append(exc.one_line())   # one distribution of several is not on the indexes
            continue
        searches.append(search_json(search, dist=spec.dist))
        measured += [point.result for point in search.points]
        texts.append(write_search(search, fact=spec.fact, dist=spec.dist, target=target.name, context=context))
    if not searches:
        raise SpecError("; ".join(missing))
    run_dir = _record(store, measured, target.name, ctx) if store is not None else None
    return BisectOutcome(request.feature, target.name, {k: v for k, v in asdict(ctx).items() if v is not None},
                         tuple(texts), tuple(searches), tuple(missing),
                         recorded=len(measured) if store is not None else 0, run_dir=run_dir)


def run_pin_bisect(request: BisectRequest, *, user: UserCompat | None = None,
                   on_read: Callable[[str, Point[Any]], None] = lambda dist, point: None) -> BisectOutcome:
    """``bisect FEATURE --package sglang --through-pins --cuda V``: per target and flavour, the SGLang release
    where FEATURE's judgement changes through the release's own pins (compat/sglang_pins.yaml's row, else its
    METADATA from the index), read from metadata and the pinned releases' wheels; no image.

    Raises:
        SpecError: a package other than sglang, no --cuda, an unknown feature, target or flavour, no release in
            the range (exit 2).
        IndexUnreachableError: an index or a file host did not answer (exit 3).
    """
    from stackforge.core.model import Flavour
    from stackforge.edges.index import releases
    from stackforge.plan.rules import FEATURES
    from stackforge.wheels.pin_effects import (
        Judge,
        judge_through_pins,
        pin_search_json,
        pinned_reader,
        release_pins_reader,
        slots_for,
        write_pin_search,
    )
    from stackforge.wheels.bisect import binary_search, full_scan
    from stackforge.wheels.tier import LISTING_TTL_S, wheel_names

    if request.package is None or str(canonicalize_name(request.package)) != "sglang":
        raise SpecError("--through-pins follows SGLang's own pins", remedy="add --package sglang")
    if not request.cuda:
        raise SpecError("--through-pins judges each release's stack for one CUDA toolkit", remedy="add --cuda 12.8")
    readers = load_readers()
    if request.feature not in FEATURES and request.feature not in wheel_names(readers):
        raise SpecError(f"unknown feature {request.feature!r}; known features: {', '.join(FEATURES)}")
    try:
        flavours = tuple(Flavour(f) for f in request.flavours) or (Flavour.DEVEL, Flavour.WHEELS)
    except ValueError:
        raise SpecError(f"unknown flavour in {', '.join(request.flavours)}",
                        remedy=f"flavours: {', '.join(f.value for f in Flavour)}") from None
    knowledge = load_knowledge(user=user)
    targets = ((target_named(knowledge.targets, request.target),) if request.target
               else tuple(knowledge.targets[name] for name in sorted(knowledge.targets)))
    indexes = configured_indexes(request.index)
    cache = WheelCache.open(indexes)

    def listing(dist: str, *, pre: bool = True, yanked: bool = True) -> list[Any]:
        return releases(dist, indexes=indexes, include_pre=pre, include_yanked=yanked, session=cache.session,
                        cache_dir=cache.index_dir, ttl_s=LISTING_TTL_S)

    # From the oldest release compat/sglang_pins.yaml holds unless --from says otherwise: older releases pin
    # no exact torch or FlashInfer (nothing to judge), and reading each one's METADATA would be most of the time.
    oldest = min(knowledge.tables.sglang_pins, key=Version, default=None)
    span = replace(request.span, first=request.span.first or oldest)
    chosen = {r.version: r for r in span.of(listing("sglang", pre=span.include_pre, yanked=span.include_yanked),
                                            "sglang")}
    pins_of = release_pins_reader(knowledge, list(chosen.values()), indexes=indexes, cache=cache)
    judge = Judge(knowledge, pinned_reader(indexes=indexes, cache=cache), readers)
    search_fn = full_scan if request.exhaustive else binary_search
    texts, searches = [], []
    for slot in slots_for(targets, (request.cuda,), flavours=flavours):
        def read(version: str, slot: Any = slot) -> Any:
            return judge_through_pins(version, pins_of(version), slot, judge, request.feature)
        search = search_fn(list(chosen), read, on_read=lambda point: on_read("sglang", point))
        texts.append(write_pin_search(search, feature=request.feature, slot=slot))
        searches.append(pin_search_json(search, feature=request.feature, slot=slot))
    context = {"cuda": request.cuda, "through_pins": True, "flavours": [f.value for f in flavours]}
    return BisectOutcome(request.feature, ", ".join(t.name for t in targets), context, tuple(texts),
                         tuple(searches), ())


def _read_context(target: Any, request: BisectRequest) -> ReadContext:
    """The target's context with the stack values the request names (``--cuda`` also means nvcc)."""
    ctx = target_context(target)
    if request.cuda:
        ctx = replace(ctx, cuda=request.cuda, nvcc=True)
    return replace(ctx, python=request.python or None, torch_cuda=request.torch_cuda or None,
                   kernel_package=request.kernel_package)


def _context_words(target: Any, request: BisectRequest) -> str:
    """``sm_120, 8x pcie, CUDA 13.1``: the target and the stack values given, for the search's heading."""
    given = (("CUDA", request.cuda), ("Python", request.python), ("torch CUDA", request.torch_cuda),
             ("kernel package", request.kernel_package))
    return ", ".join([target.sm, f"{target.gpu_count}x {target.interconnect.value}",
                      *(f"{name} {value}" for name, value in given if value)])


def _record(store: RunStore, measured: list[Measurement], target: str, ctx: ReadContext) -> Path:
    """Every release read, as wheel-tier records of one new run; the run's folder."""
    run_dir = store.start(matrix_source="", shard=None)
    for measurement in measured:
        store.write(run_dir, wheel_record(measurement, target=target, ctx=ctx, run_id=run_dir.name,
                                          host=socket.gethostname()))
    store.finish(run_dir)
    return run_dir
