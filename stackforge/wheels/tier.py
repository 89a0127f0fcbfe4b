"""The wheel tier: a reader run against a release's wheel, and its reading as a result record.

No image, no torch, no GPU: the wheel is fetched from the configured index into the wheel cache
(:mod:`stackforge.wheels.cache`), never installed, and a pure reader reads its files. A release
that publishes only an sdist is read statically (its package unpacked, never built): what its code
admits or refuses is a reading like a wheel's, but a file the sdist lacks proves nothing (an sdist lays
out headers and metadata unlike a wheel), so there "absent" is undecided unless the package tree lacks
the file's whole top-level subpackage (FlashInfer 0.2.7 has no ``flashinfer/comm``), and metadata facts
are not read from an sdist at all.

A reading becomes one :class:`~stackforge.core.records.ResultRecord` per (distribution version x fact x
target): tier ``wheel``, stack id ``wheel-<dist>-<version>`` (plus the context values the reading
depended on beyond the target's hardware), stack ``{<stack key>: version, ...}`` so the matrix can
match it to every stack that pins that version.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from zipfile import BadZipFile

from packaging.tags import Tag
from packaging.utils import parse_wheel_filename

from stackforge.core.errors import SpecError
from stackforge.core.records import Outcome, Provenance, ResultRecord, Status, Tier, utc_now
from stackforge.core.wheel_readings import (
    CodeSite,
    ReadContext,
    ReaderSpec,
    Reading,
    ReadingStatus,
    ReleaseFile,
    feature_of_fact,
)
from stackforge.edges.index import IndexConfig, Release, find_release, releases
from stackforge.plan.features import FeatureCatalog, load_feature_catalog
from stackforge.wheels.abi import library_limit
from stackforge.wheels.bisect import Point, Search, binary_search, full_scan, site_text
from stackforge.wheels.cache import WheelCache, WheelFileError
from stackforge.wheels.match import STACK_KEYS, TARGET_FIELDS, stack_key

#: What a reading of an sdist says when it cannot be a verdict.
SDIST_NO_METADATA = "sdist only: its PKG-INFO is not the metadata a built wheel would carry (not read)"
#: How long a project's release list is reused: long enough for a search and its rerun, short enough
#: that a release published today is seen within the hour.
LISTING_TTL_S = 3600
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")


@dataclass(frozen=True, slots=True)
class Measurement:
    """A reading and the file it was read from (``None`` when there was no wheel to read)."""

    dist: str
    version: str
    reading: Reading
    file: ReleaseFile | None
    duration_s: float = 0.0


def pick_wheel(release: Release) -> ReleaseFile | None:
    """The wheel a reader reads: ``py3-none-any`` first, then Linux x86_64, then any wheel.

    The readers read Python sources and metadata, which every wheel of a release carries alike.
    """
    def rank(file: ReleaseFile) -> tuple[int, str]:
        tags: frozenset[Tag] = parse_wheel_filename(file.filename)[3]
        if any(t.platform == "any" and t.abi == "none" for t in tags):
            return (0, file.filename)
        if any(t.platform.endswith("x86_64") and "linux" in t.platform for t in tags):
            return (1, file.filename)
        return (2, file.filename)
    wheels = sorted(release.wheels, key=rank)
    return wheels[0] if wheels else None


def measure(spec: ReaderSpec, release: Release, ctx: ReadContext, *, cache: WheelCache) -> Measurement:
    """Run ``spec``'s reader on ``release``'s wheel for ``ctx``.

    A reader that breaks on a release (a file it did not expect) gives an undecided reading that
    says so: one odd release must not stop a search over a hundred.
    """
    started = time.monotonic()
    wheel = pick_wheel(release)
    if spec.scan is not None:   # compiled code: read from the remote wheel by ranges, never unpacked
        reading = (_read_ranged(spec, wheel, ctx, cache) if wheel is not None else
                   Reading(spec.fact, ReadingStatus.UNDECIDED, "no wheel published (compiled code is read from "
                           "wheels only)"))
        return Measurement(release.dist, release.version, reading, wheel, time.monotonic() - started)
    if wheel is None:
        sdist = next((f for f in release.files if f.kind == "sdist"), None)
        if sdist is None:
            reading = Reading(spec.fact, ReadingStatus.UNDECIDED, "no wheel published")
        else:
            reading = _read_sdist(spec, sdist, ctx, cache)
        return Measurement(release.dist, release.version, reading, sdist, time.monotonic() - started)
    reading = cache.read(wheel, lambda root: _read(spec, root, ctx))
    return Measurement(release.dist, release.version, reading, wheel, time.monotonic() - started)


def _read(spec: ReaderSpec, root: Path, ctx: ReadContext) -> Reading:
    try:
        return spec.reader(root, ctx)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError, KeyError, IndexError, AttributeError,
            TypeError) as exc:
        return Reading(spec.fact, ReadingStatus.UNDECIDED,
                       f"reader could not read this release: {type(exc).__name__}: {exc}")


def _read_ranged(spec: ReaderSpec, wheel: ReleaseFile, ctx: ReadContext, cache: WheelCache) -> Reading:
    """``spec``'s reader on its scan of ``wheel`` (read by HTTP ranges, stored by sha256 in the wheel cache).

    Raises:
        IndexUnreachableError: the wheel's host did not answer (exit 3).
    """
    from stackforge.wheels.readers.binaries import scan_wheel

    try:
        scan = scan_wheel(spec.scan, wheel, cache=cache, limit=library_limit())
    except BadZipFile as exc:
        return Reading(spec.fact, ReadingStatus.UNDECIDED, f"the wheel could not be read by ranges: {exc}")
    reading = _read(spec, scan, ctx)   # type: ignore[arg-type]
    return replace(reading, sites=reading.sites + (CodeSite(wheel.filename, 0, scan.cost()),))


def _read_sdist(spec: ReaderSpec, sdist: ReleaseFile, ctx: ReadContext, cache: WheelCache) -> Reading:
    """A reading of an sdist-only release's package, unpacked and never built; absent is no verdict there."""
    if spec.fact.startswith("metadata:"):
        return Reading(spec.fact, ReadingStatus.UNDECIDED, SDIST_NO_METADATA)
    try:
        reading, lacking = cache.read(sdist, lambda root: _with_missing_subpackage(_read(spec, root, ctx), root))
    except WheelFileError as exc:
        return Reading(spec.fact, ReadingStatus.UNDECIDED, f"sdist only, and unreadable: {exc.one_line()}")
    if reading.status is ReadingStatus.ABSENT and lacking:
        # a whole subpackage missing from the package tree is the layout a wheel would have too
        return replace(reading, summary=f"(read in the sdist, not built; its package has no {lacking}/ at all) "
                                        f"{reading.summary}")
    if reading.status is ReadingStatus.ABSENT:
        return replace(reading, status=ReadingStatus.UNDECIDED,
                       summary=f"sdist only: {reading.summary}; a file an sdist lacks proves nothing "
                               "(it lays files out unlike a wheel)")
    return replace(reading, summary=f"(read in the sdist, not built) {reading.summary}")


def _with_missing_subpackage(reading: Reading, root: Path) -> tuple[Reading, str | None]:
    """The reading and, for an absence, the top-level subpackage its absent file's tree lacks as a whole."""
    from stackforge.wheels.readers._ast import missing_subpackage

    return reading, (missing_subpackage(root, reading.sites) if reading.status is ReadingStatus.ABSENT else None)


def read_release(spec: ReaderSpec, version: str, ctx: ReadContext, *, indexes: IndexConfig,
                 cache: WheelCache) -> Reading:
    """The reading of ``spec`` on release ``version`` of ``spec.dist``.

    Raises:
        SpecError: no such release on the configured indexes (exit 2).
        IndexUnreachableError: an index did not answer (exit 3).
    """
    return measure(spec, lookup_release(spec.dist, version, indexes=indexes, cache=cache), ctx, cache=cache).reading


def lookup_release(dist: str, version: str, *, indexes: IndexConfig, cache: WheelCache) -> Release:
    """Release ``version`` of ``dist`` (pre-releases and yanked ones too: it was asked for by name)."""
    found = releases(dist, indexes=indexes, include_pre=True, include_yanked=True, session=cache.session,
                     cache_dir=cache.index_dir, ttl_s=LISTING_TTL_S)
    release = find_release(found, version)
    if release is None:
        latest = ", ".join(r.version for r in found[-5:]) or "none"
        raise SpecError(f"{dist} {version} is not on the configured indexes ({indexes.describe()}); "
                        f"latest: {latest}", remedy="pick a published version, or pass --index-url/--find-links")
    return release


# --- readings -> records ----------------------------------------------------------------------------

def outcome_status(status: ReadingStatus) -> Status:
    """The record status of a reading: the code admits it -> pass; refuses it or lacks it -> fail;
    the reader could not tell -> undecided (kept with its evidence, deciding no cell)."""
    return {ReadingStatus.AVAILABLE: Status.PASS, ReadingStatus.UNAVAILABLE: Status.FAIL,
            ReadingStatus.ABSENT: Status.FAIL, ReadingStatus.UNDECIDED: Status.UNDECIDED}[status]


def outcome_reason(reading: Reading) -> str:
    """One line: the reading's summary, saying so when the code path is not in the release at all."""
    if reading.status is ReadingStatus.ABSENT:
        return f"absent in this release: {reading.summary}" if reading.summary else "absent in this release"
    return reading.summary


def evidence_text(measurement: Measurement) -> str:
    """The code sites as ``path:line: code`` lines, then ``wheel: <url> sha256:<hex>`` (``sdist:`` for an
    sdist-only release) and the index."""
    lines = [site_text(site) for site in measurement.reading.sites]
    if measurement.file is not None:
        lines.append(f"{measurement.file.kind}: {measurement.file.url} "
                     f"sha256:{measurement.file.sha256 or 'not given by the index'}")
        if measurement.file.index:
            lines.append(f"index: {measurement.file.index}")
    return "\n".join(lines)


def context_values(reading: Reading, ctx: ReadContext) -> dict[str, Any]:
    """The context fields the reading depended on, with their values."""
    return {name: getattr(ctx, name) for name in reading.depends_on if hasattr(ctx, name)}


# How a stack-side context value names a record (``wheel-flashinfer-python-0.7.2-cu13.1-nvcc``).
_ID_PARTS: dict[str, Callable[[Any], str]] = {
    "cuda": lambda v: f"cu{v}", "torch_cuda": lambda v: f"torchcu{v}", "python": lambda v: f"py{v}",
    "nvcc": lambda v: "nvcc" if v else "no-nvcc", "kernel_package": str,
}


def wheel_stack_id(dist: str, version: str, values: dict[str, Any]) -> str:
    """``wheel-<dist>-<version>``, plus a part for each stack-side value the reading depends on."""
    parts = [f"wheel-{dist}-{version}"]
    parts += [_ID_PARTS.get(name, lambda v, n=name: f"{n}{v}")(value) for name, value in sorted(values.items())
              if name not in TARGET_FIELDS and value is not None]
    return _UNSAFE.sub("_", "-".join(parts))[:160]


def wheel_probe_id(dist: str, fact: str) -> str:
    """``wheel.<dist>.<fact>``, with ``:`` as ``.`` (probe ids are file names: ``torch-symm-mem:flag``)."""
    return _UNSAFE.sub("_", f"wheel.{dist}.{fact.replace(':', '.')}")


def wheel_record(measurement: Measurement, *, target: str, ctx: ReadContext, run_id: str,
                 host: str = "") -> ResultRecord:
    """The result record of one measurement for one target."""
    reading = measurement.reading
    values = context_values(reading, ctx)
    stack: dict[str, Any] = {stack_key(measurement.dist): measurement.version, **values,
                             "depends_on": list(reading.depends_on)}
    return ResultRecord(
        run_id=run_id, stack_id=wheel_stack_id(measurement.dist, measurement.version, values), stack=stack,
        target=target, probe=wheel_probe_id(measurement.dist, reading.fact), feature=feature_of_fact(reading.fact),
        tier=Tier.WHEEL,
        outcome=Outcome(status=outcome_status(reading.status), reason=outcome_reason(reading),
                        evidence=evidence_text(measurement), duration_s=round(measurement.duration_s, 3)),
        provenance=Provenance(image="", versions={measurement.dist: measurement.version}, host=host,
                              runner="wheel"),
        kind="probe", created_at=utc_now())


def specs_deciding(readers: Sequence[ReaderSpec], name: str) -> tuple[ReaderSpec, ...]:
    """The reader specs that speak for ``name``: a fact (``torch-symm-mem:flag``), or a feature and every fact
    that decides it (``pcie-allreduce``: FlashInfer's module and SGLang's switch)."""
    return tuple(spec for spec in readers if name in (spec.fact, feature_of_fact(spec.fact)))


def no_reader_reason(name: str, catalog: FeatureCatalog) -> str:
    """Why no wheel reader decides the feature ``name``: which tier does, and where it runs."""
    tiers = [tier for tier, _ in catalog.spec(name).tiers if tier is not Tier.WHEEL]
    if Tier.GATE in tiers:
        return f"{name} is decided by the image: the gate tier (`stackforge probe`), not a release's wheel"
    if tiers:
        return f"{name} needs a GPU: only the {'/'.join(t.value for t in tiers)} tier decides it (`stackforge probe` on a GPU host)"
    return f"{name} has no probe or reader yet: only the rules speak for it"


def context_for(stack: Any, derived: Any, target: Any) -> ReadContext:
    """The read context of one stack on one target (a plan cell's ``stack``, ``derived``, ``target``)."""
    return ReadContext(arch=target.arch, gpu_count=target.gpu_count, interconnect=str(target.interconnect.value),
                       multicast=bool(target.multicast), cuda=stack.cuda, nvcc=bool(derived.has_nvcc),
                       torch_cuda=derived.torch_cuda, python=stack.python, kernel_package=derived.kernel_package)


def target_context(target: Any) -> ReadContext:
    """The read context of a target alone (facts that depend on the hardware only)."""
    return ReadContext(arch=target.arch, gpu_count=target.gpu_count, interconnect=str(target.interconnect.value),
                       multicast=bool(target.multicast))


# --- the reader registry, and choosing a reader ------------------------------------------------------

def load_readers() -> tuple[ReaderSpec, ...]:
    """Every reader stackforge ships (:mod:`stackforge.wheels.readers`), imported only when asked for."""
    try:
        from stackforge.wheels.readers import READERS
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("stackforge.wheels.readers"):
            return ()
        raise
    return tuple(READERS)


def resolve_specs(readers: Sequence[ReaderSpec], fact: str, package: str | None) -> tuple[ReaderSpec, ...]:
    """The readers of ``fact``: the one of ``package`` when given, else every distribution it is read from.

    Raises:
        SpecError: unknown fact, or a distribution it is not read from (exit 2), listing the valid ones.
    """
    specs = tuple(sorted(specs_deciding(readers, fact), key=lambda spec: spec.dist))
    if not specs:
        catalog = load_feature_catalog()
        if fact in catalog.features:
            raise SpecError(f"no wheel reader decides {fact}: {no_reader_reason(fact, catalog)}",
                            remedy="bisect takes the features and facts a wheel reader reads: "
                                   + ", ".join(wheel_names(readers)))
        raise SpecError(f"unknown feature {fact!r}; known features: {', '.join(catalog.features)}",
                        remedy="facts a wheel reader reads: " + ", ".join(wheel_names(readers)))
    if package is None:
        return specs
    from packaging.utils import canonicalize_name
    wanted = str(canonicalize_name(package))
    found = tuple(spec for spec in specs if spec.dist == wanted)
    if not found:
        raise SpecError(f"{fact} is not read from distribution {package!r}; it is read from: "
                        f"{', '.join(spec.dist for spec in specs)}")
    return found


def wheel_names(readers: Sequence[ReaderSpec]) -> tuple[str, ...]:
    """Every name a wheel reader speaks for: the features its facts decide, then the narrower facts."""
    return tuple(sorted({feature_of_fact(spec.fact) for spec in readers} | {spec.fact for spec in readers}))


@dataclass(frozen=True, slots=True)
class ReleaseRange:
    """Which releases of a distribution a search reads: ``first`` to ``last`` (both included, either
    open), pre-releases and yanked files only when asked."""

    first: str | None = None
    last: str | None = None
    include_pre: bool = False
    include_yanked: bool = False

    def of(self, found: Sequence[Release], dist: str) -> list[Release]:
        """The releases of ``found`` (``dist``'s listing) within the range.

        Raises:
            SpecError: a bound that is no version, or no release in the range (exit 2).
        """
        from packaging.version import InvalidVersion, Version
        try:
            low = Version(self.first) if self.first else None
            high = Version(self.last) if self.last else None
        except InvalidVersion as exc:
            raise SpecError(f"{exc}", remedy="--from/--to take PEP 440 versions such as 0.6.16.post4") from None
        kept = [r for r in found if (low is None or r.parsed >= low) and (high is None or r.parsed <= high)]
        if not kept:
            listed = f"{found[0].version} .. {found[-1].version}" if found else "none"
            raise SpecError(f"no release of {dist} between {self.first or 'the first'} and "
                            f"{self.last or 'the last'} (releases on the indexes: {listed})",
                            remedy="widen --from/--to, or add --pre / --yanked")
        return kept


def target_named(targets: Mapping[str, Any], name: str) -> Any:
    """The target profile called ``name``.

    Raises:
        SpecError: no such target (exit 2), listing the known ones.
    """
    if name not in targets:
        raise SpecError(f"unknown target {name!r}; known: {', '.join(sorted(targets))}")
    return targets[name]


def run_bisect(spec: ReaderSpec, ctx: ReadContext, *, indexes: IndexConfig, cache: WheelCache,
               span: ReleaseRange = ReleaseRange(), exhaustive: bool = False,
               on_read: Callable[[Point[Measurement]], None] | None = None) -> Search[Measurement]:
    """Where ``spec``'s verdict for ``ctx`` changes across the releases of ``spec.dist`` in ``span``.

    Raises:
        SpecError: no release in the range (exit 2).
        IndexUnreachableError: an index or a file host did not answer (exit 3).
    """
    found = releases(spec.dist, indexes=indexes, include_pre=span.include_pre, include_yanked=span.include_yanked,
                     session=cache.session, cache_dir=cache.index_dir, ttl_s=LISTING_TTL_S)
    chosen = {r.version: r for r in span.of(found, spec.dist)}

    def read(version: str) -> Measurement:
        return measure(spec, chosen[version], ctx, cache=cache)

    search = full_scan if exhaustive else binary_search
    return search(list(chosen), read, on_read=on_read)


# --- `stackforge probe --tier wheel`: the readers on the versions a matrix pins ----------------------

@dataclass(frozen=True, slots=True)
class WheelJob:
    """One reader on one pinned release, for one stack on one target."""

    spec: ReaderSpec
    version: str
    target: str
    ctx: ReadContext


def pinned_version(dist: str, stack: Any, derived: Any) -> str | None:
    """The version of ``dist`` a stack pins (its kernel package's through the derived pin), or ``None``."""
    if dist in ("sgl-kernel", "sglang-kernel"):
        return (stack.kernel or derived.kernel_version) if derived.kernel_package == dist else None
    key = STACK_KEYS.get(dist)
    return getattr(stack, key, None) if key else None


def select_readers(readers: Sequence[ReaderSpec], features: Sequence[str]) -> tuple[ReaderSpec, ...]:
    """The readers of ``features`` (facts, the features before ``:``, or the feature a fact speaks for,
    :func:`~stackforge.core.wheel_readings.feature_of_fact`; all when none are named).

    Raises:
        SpecError: a name no reader reads (exit 2), listing the known facts.
    """
    def names(spec: ReaderSpec) -> set[str]:
        return {spec.fact, spec.fact.split(":")[0], feature_of_fact(spec.fact)}

    known = set().union(*(names(spec) for spec in readers))
    unknown = [f for f in features if f not in known]
    if unknown:
        raise SpecError(f"no wheel reader for: {', '.join(unknown)}; known: {', '.join(sorted(known)) or 'none'}")
    return tuple(spec for spec in readers if not features or names(spec) & set(features))


def plan_wheel_jobs(cells: Sequence[Any], readers: Sequence[ReaderSpec]) -> tuple[WheelJob, ...]:
    """One job per kept plan cell and reader of a distribution the cell's stack pins; the same
    (reader, version, target, context) once."""
    jobs: dict[tuple[str, str, str, str, ReadContext], WheelJob] = {}
    for cell in cells:
        ctx = context_for(cell.stack, cell.derived, cell.target)
        for spec in readers:
            version = pinned_version(spec.dist, cell.stack, cell.derived)
            if version is not None:
                jobs.setdefault((spec.fact, spec.dist, version, cell.target.name, ctx),
                                WheelJob(spec, version, cell.target.name, ctx))
    return tuple(jobs.values())


def list_releases(jobs: Sequence[WheelJob], *, indexes: IndexConfig, cache: WheelCache) -> dict[str, list[Release]]:
    """The releases of every distribution the jobs read (pre-releases and yanked ones too: pinned by name).

    Raises:
        IndexUnreachableError: an index did not answer (exit 3) -- before anything is read or recorded.
    """
    return {dist: releases(dist, indexes=indexes, include_pre=True, include_yanked=True, session=cache.session,
                           cache_dir=cache.index_dir, ttl_s=LISTING_TTL_S)
            for dist in dict.fromkeys(job.spec.dist for job in jobs)}


def run_wheel_jobs(jobs: Sequence[WheelJob], *, listed: Mapping[str, Sequence[Release]], indexes: IndexConfig,
                   cache: WheelCache, run_id: str, host: str = "",
                   write: Callable[[ResultRecord], Any] | None = None,
                   on_done: Callable[[ResultRecord], None] | None = None) -> list[ResultRecord]:
    """Read every job's release (``listed``: :func:`list_releases`); one record per (distribution
    version x fact x target [x context]).

    A pinned version the indexes do not list is recorded as an ``error`` (nothing to read), and the
    rest goes on.

    Raises:
        IndexUnreachableError: a file host did not answer (exit 3).
    """
    done: dict[tuple[str, str, str], ResultRecord] = {}
    for job in jobs:
        release = find_release(listed[job.spec.dist], job.version)
        if release is None:
            record = _missing_release_record(job, indexes, run_id=run_id, host=host)
        else:
            record = wheel_record(measure(job.spec, release, job.ctx, cache=cache), target=job.target,
                                  ctx=job.ctx, run_id=run_id, host=host)
        if record.key in done:
            continue
        done[record.key] = record
        if write is not None:
            write(record)
        if on_done is not None:
            on_done(record)
    return list(done.values())


def _missing_release_record(job: WheelJob, indexes: IndexConfig, *, run_id: str, host: str) -> ResultRecord:
    dist = job.spec.dist
    return ResultRecord(
        run_id=run_id, stack_id=wheel_stack_id(dist, job.version, {}),
        stack={stack_key(dist): job.version, "depends_on": []}, target=job.target,
        probe=wheel_probe_id(dist, job.spec.fact), feature=feature_of_fact(job.spec.fact), tier=Tier.WHEEL,
        outcome=Outcome(status=Status.ERROR, reason=f"{dist} {job.version} is not on the configured indexes",
                        evidence=indexes.describe()),
        provenance=Provenance(versions={dist: job.version}, host=host, runner="wheel"), created_at=utc_now())
