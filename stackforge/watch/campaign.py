"""What ``stackforge watch`` does: read every release the index uploaded since the last watch.

For each new release of a watched distribution (:data:`WATCHED`):

* the wheel tier reads it and the release before it, for every fact a reader reads from that
  distribution and every target (and stack context) of the matrix: a reading that changed is reported
  with the code on both sides;
* every rule of ``compat/rules`` whose version bound the release sits at is verified again
  (:func:`stackforge.wheels.verify.verify_rules`); a rule the release proves wrong comes with a
  proposed patch (:mod:`stackforge.watch.patches`);
* a refusal the new code lifts is a dead end it unblocks (admitted by the code, not measured working).

With a matrix that follows the index (selectors, ``derive``), the lock is resolved again without being
written, and what moved is the list of stacks a follow-up build adds. The first watch on a results
folder records the newest releases as its baseline and reads nothing; ``--after V --until V`` replays
history for one distribution and leaves the state alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackforge.core.data import data_dir
from stackforge.core.errors import EnvironmentFault, SpecError
from stackforge.core.wheel_readings import ReadContext, ReadingStatus, feature_of_fact
from stackforge.edges.index import IndexConfig, IndexRequest, Release, configured_indexes, release_listing
from stackforge.plan.lock_resolve import LockUpdate, read_release_pins, update_lock
from stackforge.plan.matrix_file import selectors_of
from stackforge.plan.planner import Knowledge, load_knowledge, plan_file
from stackforge.plan.user_compat import UserCompat
from stackforge.wheels.cache import WheelCache
from stackforge.wheels.pin_effects import PinEffects, with_pin_effects
from stackforge.wheels.readings import WheelReadings
from stackforge.wheels.tier import Measurement, context_for, load_readers, measure, target_context, target_named
from stackforge.wheels.verify import RuleCheck, touched_by_release, verify_rules
from stackforge.watch.patches import ProposedPatch, propose_patch
from stackforge.watch.state import (SeenRelease, WatchState, read_state, state_lock, state_path, upload_instant,
                                    write_state)

#: The distributions watched by default: what a serving stack is built from.
WATCHED = ("sglang", "sglang-kernel", "sgl-kernel", "flashinfer-python", "flashinfer-cubin", "torch")
#: Origin of the rules generated from SGLang's pins: data, re-read by --update-lock, not verified here.
_PIN_ORIGINS = ("compat/sglang_pins.yaml",)


@dataclass(frozen=True, slots=True)
class WatchRequest:
    """One ``stackforge watch``.

    Attributes:
        matrix_path: the matrix whose targets and stack contexts the releases are read for.
        results_root: where the state file lives (``<results>/watch-state.json``).
        packages: the distributions to watch.
        after, until: replay: the releases after ``after`` up to ``until`` (one package; state untouched).
        targets: target names (default: the matrix's).
    """

    matrix_path: Path
    results_root: Path
    packages: tuple[str, ...] = WATCHED
    after: str | None = None
    until: str | None = None
    targets: tuple[str, ...] = ()
    index: IndexRequest = IndexRequest()

    @property
    def replay(self) -> bool:
        return self.after is not None or self.until is not None


@dataclass(frozen=True, slots=True)
class ReadingComparison:
    """One fact on one target (for the contexts named): its reading before and after a release."""

    fact: str
    target: str
    contexts: tuple[str, ...]
    before: Measurement | None
    after: Measurement

    @property
    def feature(self) -> str:
        return feature_of_fact(self.fact)

    @property
    def changed(self) -> bool:
        if self.before is None:
            return False
        return _reading_key(self.before) != _reading_key(self.after) and ReadingStatus.UNDECIDED not in (
            self.before.reading.status, self.after.reading.status)

    @property
    def no_longer_decided(self) -> bool:
        """The reader decided the release before and cannot decide this one: the code moved under it (the
        reader needs a look), which is news, never an unchanged reading."""
        return (self.before is not None and self.before.reading.status is not ReadingStatus.UNDECIDED
                and self.after.reading.status is ReadingStatus.UNDECIDED)

    @property
    def unblocks(self) -> bool:
        """The release's code admits what the release before refused (a dead end it opens)."""
        return (self.changed and self.after.reading.status is ReadingStatus.AVAILABLE and ":" not in self.fact
                and self.before is not None
                and self.before.reading.status in (ReadingStatus.UNAVAILABLE, ReadingStatus.ABSENT))

    @property
    def blocks(self) -> bool:
        """The release's code refuses what the release before admitted (a regression)."""
        return (self.changed and self.before is not None and ":" not in self.fact
                and self.before.reading.status is ReadingStatus.AVAILABLE
                and self.after.reading.status in (ReadingStatus.UNAVAILABLE, ReadingStatus.ABSENT))


@dataclass(frozen=True, slots=True)
class RuleRecheck:
    """A rule read again because a new release sits at its bound, and the patch when it no longer holds."""

    check: RuleCheck
    patch: ProposedPatch | None = None


#: Why a release of a watched package was not read when no wheel reader reads that package.
NO_READER = "listed, not read (no reader)"


@dataclass(frozen=True, slots=True)
class NewRelease:
    """A release the index uploaded since the last watch, and what reading it showed."""

    dist: str
    version: str
    uploaded: str
    previous: str | None                 # the release it is compared with (None: the first release)
    yanked: bool = False
    unread: str = ""                     # why it was not read ("" when it was)
    comparisons: tuple[ReadingComparison, ...] = ()
    rules: tuple[RuleRecheck, ...] = ()
    pins: dict[str, str] | None = None   # an SGLang release compat/sglang_pins.yaml lacks: its pins, read now
    pin_effects: PinEffects | None = None  # an SGLang release: what its own pins change (wheels/pin_effects.py)

    @property
    def changed(self) -> tuple[ReadingComparison, ...]:
        return tuple(c for c in self.comparisons if c.changed)

    @property
    def patches(self) -> tuple[ProposedPatch, ...]:
        return tuple(r.patch for r in self.rules if r.patch is not None)


@dataclass(frozen=True, slots=True)
class WatchReport:
    """Everything one watch found."""

    checked_at: str
    index: str
    matrix: str
    targets: tuple[str, ...]
    baseline: dict[str, str]             # dist -> the release new ones were counted after ("" none yet)
    newest: dict[str, SeenRelease]       # dist -> newest final release on the index now
    releases: tuple[NewRelease, ...] = ()
    notes: tuple[str, ...] = ()          # first-watch baselines, skipped version strings, absent packages
    lock: LockUpdate | None = None
    replay: bool = False
    seconds: float = 0.0

    @property
    def anything_new(self) -> bool:
        # A release of a listed package no reader reads is shown, but is no news by itself: nothing was
        # read that could have changed.
        return any(r.unread != NO_READER for r in self.releases)


def run_watch(request: WatchRequest, *, user: UserCompat | None = None, now: datetime | None = None,
              on_progress: Callable[[str], None] = lambda line: None,
              publish: Callable[[WatchReport], None] = lambda report: None) -> WatchReport:
    """Watch the index once (see the module docstring).

    ``publish`` writes the reports (files, the terminal) before the state is saved: the state is the
    watch's commit, so a report that could not be written leaves it where it was and the next watch
    reports the same releases again.

    Raises:
        SpecError: bad versions, an unknown package, --after/--until with several packages, unknown
            target, corrupt state (exit 2).
        WatchBusyError: another watch holds the state (exit 2).
        IndexUnreachableError: an index did not answer (exit 3); the state file is left as it was.
        EnvironmentFault: a report or the state could not be written (exit 3); the state is left as it was.
    """
    import time
    started = time.monotonic()
    packages = _check_request(request)
    knowledge = load_knowledge(user=user)
    plan = plan_file(request.matrix_path, targets=request.targets, user_compat=user)
    targets = tuple(target_named(knowledge.targets, t.name) for t in plan.targets)
    contexts = _contexts(plan, targets)
    indexes = configured_indexes(request.index)
    cache = WheelCache.open(indexes)
    path = state_path(request.results_root)
    with state_lock(path):
        state = read_state(path)
        listings = {dist: _listing(dist, indexes, cache, on_progress) for dist in packages}
        baseline, notes = _baselines(request, state, listings)
        since, warnings = _upload_marks(request, state, listings, now or datetime.now(timezone.utc))
        notes += warnings
        for warning in warnings:   # on the terminal as well: the report may go only to a file
            on_progress(warning)
        releases = []
        for dist, (found, skipped) in listings.items():
            notes += [f"{dist}: {name} skipped: its version is not PEP 440" for name in skipped]
            for release in _new_releases(found, baseline.get(dist, ""), request.until, since.get(dist)):
                on_progress(f"reading {dist} {release.version}")
                releases.append(_read_new_release(dist, release, found, contexts, knowledge, indexes, cache))
        releases = with_pin_effects(releases, plan=plan, knowledge=knowledge, indexes=indexes, cache=cache,
                                    listing=listings.get("sglang", ((), ()))[0])
        lock = _lock_diff(request, indexes, on_progress)
        checked_at = (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
        newest = {dist: _newest(found, request.until) for dist, (found, _) in listings.items()}
        newest = {dist: seen for dist, seen in newest.items() if seen is not None}
        report = WatchReport(checked_at, indexes.describe(), str(request.matrix_path),
                             tuple(t.name for t in targets), baseline, newest, tuple(releases), tuple(notes), lock,
                             request.replay, round(time.monotonic() - started, 1))
        _written(lambda: publish(report), "the watch report")   # reports first, the state (the commit) last
        if not request.replay:
            kept = dict(state.seen) if state else {}
            _written(lambda: write_state(path, WatchState({**kept, **newest}, checked_at, indexes.describe())),
                     "the watch state")
    return report


def _written(write: Callable[[], None], what: str) -> None:
    """Run one write of the watch's; an OS error (read-only folder, full disk) is an environment fault.

    Raises:
        EnvironmentFault: the write failed (exit 3), naming what could not be written and why.
    """
    try:
        write()
    except OSError as exc:
        fault = EnvironmentFault.from_os_error(exc, doing=f"writing {what}")
        raise EnvironmentFault(fault.message, path=fault.path, reason=fault.reason,
                               remedy=f"{fault.remedy}; the watch state was left as it was, so the next watch "
                                      "reports the same releases again") from None


# --------------------------------------------------------------------------- the request

def _check_request(request: WatchRequest) -> tuple[str, ...]:
    packages = tuple(dict.fromkeys(str(canonicalize_name(p)) for p in request.packages))
    unknown = [p for p in packages if p not in WATCHED]
    if unknown:
        raise SpecError(f"watch does not follow {', '.join(repr(p) for p in unknown)}",
                        remedy=f"watched packages: {', '.join(WATCHED)}")
    if request.replay and len(packages) != 1:
        raise SpecError("--after/--until replay one distribution's history", remedy="add exactly one --package")
    for name, value in (("--after", request.after), ("--until", request.until)):
        if value is not None:
            try:
                Version(value)
            except InvalidVersion:
                raise SpecError(f"{name} {value!r} is not a PEP 440 version", remedy="e.g. 0.6.16.post4") from None
    return packages


def _contexts(plan: Any, targets: Sequence[Any]) -> dict[str, dict[ReadContext, str]]:
    """Per target, the read contexts of the matrix's kept stacks on it (the target alone when none), each
    with the words that name it (``CUDA 13.1, nvcc, py3.11``)."""
    by_target: dict[str, dict[ReadContext, str]] = {t.name: {} for t in targets}
    for cell in plan.cells:
        if cell.pruned or cell.target.name not in by_target:
            continue
        ctx = context_for(cell.stack, cell.derived, cell.target)
        by_target[cell.target.name].setdefault(ctx, cell.stack.id)
    for target in targets:
        if not by_target[target.name]:
            by_target[target.name][target_context(target)] = target.name
    return by_target


# --------------------------------------------------------------------------- the index

def _listing(dist: str, indexes: IndexConfig, cache: WheelCache,
             on_progress: Callable[[str], None]) -> tuple[tuple[Release, ...], tuple[str, ...]]:
    """A distribution's final releases (yanked ones included, marked), asked afresh."""
    on_progress(f"listing {dist}")
    # ttl 0 asks every time; the cached page's validators make an unchanged page a 304 (headers only).
    listing = release_listing(dist, indexes=indexes, include_yanked=True, session=cache.session,
                              cache_dir=cache.index_dir, ttl_s=0)
    return listing.releases, listing.skipped


def _baselines(request: WatchRequest, state: WatchState | None,
               listings: dict[str, tuple[tuple[Release, ...], tuple[str, ...]]]) -> tuple[dict[str, str], list[str]]:
    """The release after which a release counts as new, per distribution, and notes on the choice."""
    baseline: dict[str, str] = {}
    notes: list[str] = []
    for dist, (found, _) in listings.items():
        if not found:
            notes.append(f"{dist}: no final release on the index")
            continue
        if request.after is not None:
            baseline[dist] = request.after
        elif state is not None and dist in state.seen:
            baseline[dist] = state.seen[dist].version
        else:
            newest = _newest(found, request.until)
            notes.append(f"{dist}: first watch; baseline {newest.version if newest else 'none'} recorded, nothing "
                         "read (`--after V` reads what came after V)")
            baseline[dist] = ""
    return baseline, notes


def _upload_marks(request: WatchRequest, state: WatchState | None,
                  listings: dict[str, tuple[tuple[Release, ...], tuple[str, ...]]],
                  now: datetime) -> tuple[dict[str, datetime], list[str]]:
    """Per distribution the upload time after which a release is new (from the state), and warnings.

    A state whose last upload is later than now, or later than every upload on the index, comes from
    another index or clock: it is warned about and versions decide for that watch (an upload mark from
    the future would hide every new release)."""
    marks: dict[str, datetime] = {}
    warnings: list[str] = []
    if request.replay or state is None:
        return marks, warnings
    for dist, (found, _) in listings.items():
        seen = state.seen.get(dist)
        mark = upload_instant(seen.last_upload) if seen is not None and seen.last_upload else None
        if mark is None:
            continue
        on_index = [instant for r in found if (instant := upload_instant(r.uploaded)) is not None]
        if mark > now:
            warnings.append(f"warning: {dist}: the watch state's last upload {seen.last_upload} is later than now "
                            f"({now:%Y-%m-%dT%H:%M:%SZ}): a state from another clock or index; new releases are "
                            "counted by version this time")
        elif on_index and mark > max(on_index):
            warnings.append(f"warning: {dist}: the watch state's last upload {seen.last_upload} is later than any "
                            f"upload on the index ({max(on_index):%Y-%m-%dT%H:%M:%SZ}): a state from another index, "
                            "or releases removed; new releases are counted by version this time")
        else:
            marks[dist] = mark
    return marks, warnings


def _new_releases(found: Sequence[Release], after: str, until: str | None,
                  since: datetime | None = None) -> list[Release]:
    """The releases to read: uploaded after ``since`` when the state has an upload mark (a backport with a
    lower version is new; a release already seen, yanked or not, is not), else those after ``after`` in
    version order (a replay, a state without upload times, a release the index gives no upload time)."""
    if not after:
        return []
    low, high = Version(after), Version(until) if until else None
    if since is None:
        return [r for r in found if r.parsed > low and (high is None or r.parsed <= high)]
    new = []
    for release in found:
        uploaded = upload_instant(release.uploaded) if release.uploaded else None
        if (uploaded > since) if uploaded is not None else release.parsed > low:
            new.append(release)
    return new


def _newest(found: Sequence[Release], until: str | None) -> SeenRelease | None:
    """The newest usable release and the latest upload of any listed release (a yanked one included)."""
    listed = [r for r in found if until is None or r.parsed <= Version(until)]
    usable = [r for r in listed if not r.yanked]
    uploads = [r.uploaded for r in listed if r.uploaded and upload_instant(r.uploaded) is not None]
    last_upload = max(uploads, key=lambda text: upload_instant(text), default="")
    return SeenRelease(usable[-1].version, usable[-1].uploaded, last_upload) if usable else None


# --------------------------------------------------------------------------- reading one release

def _read_new_release(dist: str, release: Release, found: Sequence[Release],
                      contexts: dict[str, dict[ReadContext, str]], knowledge: Knowledge, indexes: IndexConfig,
                      cache: WheelCache) -> NewRelease:
    earlier = [r for r in found if r.parsed < release.parsed and not r.yanked]
    previous = earlier[-1] if earlier else None
    base = NewRelease(dist, release.version, release.uploaded, previous.version if previous else None)
    if release.yanked:
        return replace(base, yanked=True, unread="yanked: not read, and never chosen by a selector")
    specs = [spec for spec in load_readers() if spec.dist == dist]
    if not specs:
        return replace(base, unread=NO_READER)
    memo: dict[tuple[str, str, ReadContext], Measurement] = {}

    def read(spec: Any, which: Release, ctx: ReadContext) -> Measurement:
        key = (spec.fact, which.version, ctx)
        if key not in memo:
            memo[key] = measure(spec, which, ctx, cache=cache)
        return memo[key]

    comparisons = []
    for target, by_ctx in contexts.items():
        grouped: dict[tuple[Any, ...], ReadingComparison] = {}
        for spec in specs:
            for ctx, name in by_ctx.items():
                after = read(spec, release, ctx)
                before = read(spec, previous, ctx) if previous else None
                key = (spec.fact, _reading_key(after), after.reading.summary,
                       _reading_key(before) if before else None, before.reading.summary if before else None)
                if key in grouped:
                    grouped[key] = replace(grouped[key], contexts=grouped[key].contexts + (name,))
                else:
                    grouped[key] = ReadingComparison(spec.fact, target, (name,), before, after)
        comparisons += grouped.values()
    usable = [r for r in found if not r.yanked and r.parsed <= release.parsed]
    rules = _recheck_rules(dist, release.version, usable, knowledge, indexes, cache)
    return replace(base, comparisons=tuple(comparisons), rules=rules,
                   pins=_missing_pins(dist, release, knowledge, indexes, cache))


def _missing_pins(dist: str, release: Release, knowledge: Knowledge, indexes: IndexConfig,
                  cache: WheelCache) -> dict[str, str] | None:
    """A new SGLang release's pins, when compat/sglang_pins.yaml has no row for it (the planner needs one)."""
    if dist != "sglang" or release.version in knowledge.tables.sglang_pins:
        return None
    pins = read_release_pins(release, indexes, cache.session)
    return pins.as_row() if pins is not None else None


def _reading_key(measurement: Measurement | None) -> tuple[str, str] | None:
    if measurement is None:
        return None
    return (measurement.reading.status.value, measurement.reading.manner)


def _recheck_rules(dist: str, version: str, usable: Sequence[Release], knowledge: Knowledge,
                   indexes: IndexConfig, cache: WheelCache) -> tuple[RuleRecheck, ...]:
    """Verify every rule whose bound ``version`` sits at, with the releases up to it; patch the wrong ones."""
    versions = [r.version for r in usable]
    rules = rules_to_recheck(knowledge.rules, dist, version, versions)
    if not rules:
        return ()
    readings = WheelReadings(indexes=indexes, cache=cache, found={dist: list(usable)})
    report = verify_rules(rules, knowledge.targets, evaluate=readings.evaluate, list_releases=readings.list_releases)
    by_id = {rule.id: rule for rule in rules}
    return tuple(RuleRecheck(v, propose_patch(by_id[v.rule_id], v, version, _rule_file_text(by_id[v.rule_id])))
                 for v in report.rules)


def rules_to_recheck(rules: Sequence[Any], dist: str, version: str, versions: Sequence[str]) -> list[Any]:
    """The rules ``dist`` ``version`` can prove wrong: those whose bound it sits at, and those whose bound
    the release before it sits at (a bound written one release too early shows only when the release
    after it reads like the one before)."""
    position = versions.index(version) if version in versions else -1
    previous = versions[position - 1] if position > 0 else None
    return [r for r in rules if r.origin not in _PIN_ORIGINS
            and (touched_by_release(r, dist, version, versions)
                 or (previous is not None and touched_by_release(r, dist, previous, versions)))]


def _rule_file_text(rule: Any) -> str:
    """The text of the shipped file a rule was read from ("" for a rule from elsewhere)."""
    relative = rule.origin.rpartition(":")[0]
    if not relative.startswith("compat/"):
        return ""
    path = data_dir("compat") / relative.removeprefix("compat/")
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def _lock_diff(request: WatchRequest, indexes: IndexConfig, on_progress: Callable[[str], None]) -> LockUpdate | None:
    """With a matrix that follows the index: its lock resolved again (not written) and what moved."""
    selectors, derive_from, _ = selectors_of(request.matrix_path)
    if not selectors and not derive_from:
        return None
    on_progress("resolving the matrix's selectors")
    until = {str(canonicalize_name(request.packages[0])): request.until} if request.until else None
    return update_lock(request.matrix_path, indexes=indexes, until=until, write=False)


__all__ = ["WATCHED", "NewRelease", "ReadingComparison", "RuleRecheck", "WatchReport", "WatchRequest", "run_watch"]
