"""An SGLang release judged by its own pins: what its Requires-Dist of torch, FlashInfer and the kernel change.

A new SGLang release moves its pins as often as its code. Its derived stack (the release with the torch,
FlashInfer and kernel it pins, :mod:`stackforge.plan.release_pins`) is judged, per target, CUDA version and
flavour (a **slot**), by the rules and by the wheel readers of the pinned releases, and compared with the
stack the release before pinned:

    sglang 0.5.10 pins flashinfer 0.6.7.post2 (was 0.6.3): flashinfer-jit on rtx-pro-6000-x8-pcie with
    CUDA 12.8 (devel) becomes unavailable (rule flashinfer-sm120-needs-cuda129-nvcc; ...)

Each flavour is judged on its own: a wheels image without nvcc has no JIT at all, and still its pinned
FlashInfer's CUDA-version gate may start to refuse; that is reported ("stays unavailable ... now also"),
never hidden behind the no-nvcc rule.

Pure: the pins and the readings come through callbacks (:class:`Sources`); the watch
(:func:`watch_pin_effects`) and ``bisect --through-pins`` (:mod:`stackforge.wheels.bisect_campaign`) wire
them to the index and the wheel cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stackforge.core.errors import StackforgeError
from stackforge.core.model import DEFAULT_OS, Flavour, Stack, Target
from stackforge.core.versions import parse_version
from stackforge.core.wheel_readings import ReadContext, ReaderSpec, Reading, ReadingStatus, feature_of_fact
from stackforge.plan.derive import derive
from stackforge.plan.planner import Knowledge, cell_facts
from stackforge.plan.rules import Effect, Evaluator, Rule
from stackforge.wheels.tier import context_for

#: The pins a derived stack takes from its SGLang release (the rest is the slot's).
PIN_KEYS = ("torch", "flashinfer", "kernel_package", "kernel")
#: The rule facts a release's pins set, or that follow from them: a rule testing one of them speaks for the pins.
PIN_FACTS = frozenset({"torch", "flashinfer", "kernel", "kernel_package", "torch_variant", "torch_cuda", "nccl"})
#: The distributions a release pins (its own code is the watch's other comparison).
PINNED_DISTS = ("torch", "flashinfer-python", "sgl-kernel", "sglang-kernel")
#: Where each flavour's stack runs when the matrix has no stack of that flavour (the shipped matrix's choice).
FLAVOUR_DEFAULTS = {Flavour.DEVEL: (DEFAULT_OS, "3.12"), Flavour.RUNTIME: (DEFAULT_OS, "3.12"),
                    Flavour.WHEELS: ("debian12", "3.11")}

#: One reading of a pinned release: (reader, version, context) -> the measurement (anything with ``.reading``).
ReadFn = Callable[[ReaderSpec, str, ReadContext], Any]


# --------------------------------------------------------------------------- where a stack is judged

@dataclass(frozen=True, slots=True)
class Slot:
    """One place a release's derived stack is judged: a target, a CUDA toolkit and a flavour (with its OS and
    Python)."""

    target: Target
    cuda: str
    flavour: Flavour
    os: str
    python: str

    @property
    def words(self) -> str:
        return f"{self.target.name} with CUDA {self.cuda} ({self.flavour.value})"

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target.name, "cuda": self.cuda, "flavour": self.flavour.value, "os": self.os,
                "python": self.python}


def slots_for(targets: Sequence[Target], cudas: Iterable[str], stacks: Sequence[Stack] = (),
              flavours: Sequence[Flavour] = (Flavour.DEVEL, Flavour.WHEELS)) -> tuple[Slot, ...]:
    """Every (target x CUDA x flavour): both flavours even where the matrix builds only one, since a wheels
    stack's missing nvcc must not hide what the devel one shows. OS and Python follow the matrix's stacks of
    that CUDA and flavour, else :data:`FLAVOUR_DEFAULTS`."""
    slots = []
    for target in targets:
        for cuda in dict.fromkeys(cudas):
            for flavour in flavours:
                like = next((s for s in stacks if s.cuda == cuda and s.flavour is flavour), None)
                os_name, python = (like.os, like.python) if like else FLAVOUR_DEFAULTS[flavour]
                slots.append(Slot(target, cuda, flavour, os_name, python))
    return tuple(slots)


# --------------------------------------------------------------------------- one feature of one stack

@dataclass(frozen=True, slots=True)
class PinnedReading:
    """A reader's word on one pinned release for the stack's context."""

    dist: str
    version: str
    fact: str
    status: ReadingStatus
    summary: str
    site: str = ""     # the first code line it was decided on

    @property
    def words(self) -> str:
        return f"{self.dist} {self.version} {self.fact}: {self.status.value}"

    def to_json(self) -> dict[str, Any]:
        return {"package": self.dist, "version": self.version, "fact": self.fact, "status": self.status.value,
                "summary": self.summary, "site": self.site}


@dataclass(frozen=True, slots=True)
class Judgement:
    """One feature of one derived stack in one slot: the rules that speak for it and the readings of the
    pinned releases. ``status``: ``pruned`` (the pins cannot make this stack: ``rules`` prune it),
    ``unavailable`` (a rule or a reading refuses it), ``hazard``, ``admitted`` (the code admits it, no rule
    refuses it: nothing ran it), ``unknown`` (nothing decides it)."""

    feature: str
    status: str
    rules: tuple[str, ...] = ()
    readings: tuple[PinnedReading, ...] = ()
    stack_id: str = ""

    @property
    def key(self) -> tuple[Any, ...]:
        """What is compared between two stacks: the status and its evidence, without the versions read."""
        return (self.status, self.rules, _readings_key(self.readings))

    @property
    def evidence(self) -> str:
        rules = [f"rule {r}" for r in self.rules]
        readings = [r.words for r in self.readings]
        return "; ".join(rules + readings) or "no rule, no reading"

    def to_json(self) -> dict[str, Any]:
        return {"feature": self.feature, "status": self.status, "rules": list(self.rules),
                "readings": [r.to_json() for r in self.readings], "stack": self.stack_id}


def derived_stack(sglang: str, pins: Mapping[str, str], slot: Slot) -> Stack | str:
    """The stack SGLang ``sglang`` pins in ``slot``, or why there is none (a pin that is a range, not a
    version: the index, not the release, would choose)."""
    missing = [key for key in ("torch", "flashinfer") if not _exact(pins.get(key))]
    if missing:
        return "pins no exact " + " and ".join(f"{k} ({pins.get(k) or 'none'})" for k in missing)
    kernel = pins.get("kernel")
    return Stack(cuda=slot.cuda, torch=pins["torch"], flashinfer=pins["flashinfer"], sglang=sglang,
                 python=slot.python, flavour=slot.flavour, os=slot.os, kernel=kernel if _exact(kernel) else None)


def _exact(value: str | None) -> bool:
    return bool(value) and value[0] not in "<>=!~" and "," not in value


class Judge:
    """Judges derived stacks with one knowledge and one reading callback (rules evaluated once per distinct
    set of facts, readings memoised by the caller's callback)."""

    def __init__(self, knowledge: Knowledge, read: ReadFn, readers: Sequence[ReaderSpec], *,
                 dists: Sequence[str] | None = None) -> None:
        self._knowledge = knowledge
        self._evaluator = Evaluator(knowledge.rules)
        self._read = read
        self._readers = tuple(r for r in readers if dists is None or r.dist in dists)

    def judge(self, sglang: str, pins: Mapping[str, str], slot: Slot,
              features: Sequence[str]) -> dict[str, Judgement] | str:
        """Each feature of SGLang ``sglang`` with ``pins`` in ``slot``; a string saying why when there is no
        such stack (see :func:`derived_stack`), or the tables cannot derive it."""
        stack = derived_stack(sglang, pins, slot)
        if isinstance(stack, str):
            return stack
        tables = replace(self._knowledge.tables, sglang_pins={**self._knowledge.tables.sglang_pins,
                                                               sglang: dict(pins)})
        try:
            derived = derive(stack, tables)
        except StackforgeError as exc:
            return exc.one_line()
        findings, _ = self._evaluator.judge(cell_facts(stack, slot.target, derived))
        pruning = tuple(f.rule.id for f in findings if f.rule.effect is Effect.INCOMPATIBLE)
        if pruning:
            return {f: Judgement(f, "pruned", pruning, stack_id=stack.id) for f in features}
        ctx = context_for(stack, derived, slot.target)
        versions = {"sglang": sglang, "flashinfer-python": stack.flashinfer, "torch": stack.torch}
        if derived.kernel_package and derived.kernel_version:
            versions[derived.kernel_package] = derived.kernel_version
        judged = {}
        for feature in features:
            rules = [f.rule for f in findings if f.rule.feature == feature
                     and f.rule.effect in (Effect.FEATURE_UNAVAILABLE, Effect.HAZARD)]
            readings = tuple(self._reading(spec, versions[spec.dist], ctx) for spec in self._readers
                             if feature_of_fact(spec.fact) == feature and spec.dist in versions)
            judged[feature] = Judgement(feature, _status(rules, readings), tuple(r.id for r in rules), readings,
                                        stack.id)
        return judged

    def _reading(self, spec: ReaderSpec, version: str, ctx: ReadContext) -> PinnedReading:
        reading: Reading = self._read(spec, version, ctx).reading
        site = f"{reading.sites[0].path}:{reading.sites[0].line}" if reading.sites else ""
        return PinnedReading(spec.dist, version, spec.fact, reading.status, reading.summary, site)


def through_pins(rule_ids: Sequence[str], rules: Mapping[str, Rule]) -> tuple[str, ...]:
    """The rules of ``rule_ids`` that test a fact a release's pins set (:data:`PIN_FACTS`)."""
    return tuple(r for r in rule_ids if r in rules and any(c.fact in PIN_FACTS for c in rules[r].conditions))


def _status(rules: Sequence[Rule], readings: Sequence[PinnedReading]) -> str:
    """The worst word: a refusal by a rule or a reading, then a hazard, then what the code admits."""
    refused = (ReadingStatus.UNAVAILABLE, ReadingStatus.ABSENT)
    if any(r.effect is Effect.FEATURE_UNAVAILABLE for r in rules) or any(r.status in refused for r in readings):
        return "unavailable"
    if rules:
        return "hazard"
    if readings and all(r.status is ReadingStatus.AVAILABLE for r in readings):
        return "admitted"
    return "unknown"


# --------------------------------------------------------------------------- a release against the one before

@dataclass(frozen=True, slots=True)
class PinChange:
    """One feature in one slot whose judgement the pins moved."""

    slot: Slot
    before: Judgement
    after: Judgement

    @property
    def feature(self) -> str:
        return self.after.feature

    def words(self) -> str:
        """``flashinfer-jit on T with CUDA 12.8 (devel) becomes unavailable (rule ...)`` or, when the status
        stays, what its evidence gained and lost."""
        head = f"{self.feature} on {self.slot.words}"
        if self.before.status != self.after.status:
            return f"{head} becomes {self.after.status} ({self.after.evidence}; was {self.before.status}: " \
                   f"{self.before.evidence})"
        return f"{head} stays {self.after.status}, its evidence moves: {self.before.evidence} -> {self.after.evidence}"

    def to_json(self) -> dict[str, Any]:
        return {**self.slot.to_json(), "feature": self.feature, "before": self.before.to_json(),
                "after": self.after.to_json()}


@dataclass(frozen=True, slots=True)
class PinEffects:
    """What SGLang ``sglang``'s pins change against ``previous``'s, in every slot."""

    sglang: str
    previous: str | None
    moves: tuple[str, ...]                  # "flashinfer 0.6.3 -> 0.6.7.post2"
    changes: tuple[PinChange, ...] = ()
    unjudged: tuple[str, ...] = ()          # slots or releases that could not be judged, and why
    slots: int = 0

    @property
    def pins_words(self) -> str:
        return ", ".join(self.moves) if self.moves else "the same pins"

    def lines(self) -> list[str]:
        """``sglang 0.5.10 pins flashinfer 0.6.7.post2 (was 0.6.3): <change>``; with several changes the pins
        once, then one change a line."""
        if not self.moves:
            return ([f"sglang {self.sglang} keeps the pins of {self.previous}: nothing to judge"]
                    if self.previous else [])
        head = f"sglang {self.sglang} pins {self.pins_words}"
        if not self.changes:
            lines = [f"{head}: no feature moves in {self.slots} slot(s) (target x CUDA x flavour)"]
        elif len(self.changes) == 1:
            lines = [f"{head}: {self.changes[0].words()}"]
        else:   # the pins once, then one change a line (a nested list in markdown)
            lines = [f"{head}:", *(f"  - {change.words()}" for change in self.changes)]
        return lines + [f"  - not judged: {why}" for why in self.unjudged]

    def to_json(self) -> dict[str, Any]:
        return {"sglang": self.sglang, "previous": self.previous, "moves": list(self.moves),
                "changes": [c.to_json() for c in self.changes], "unjudged": list(self.unjudged), "slots": self.slots}


def pin_moves(before: Mapping[str, str], after: Mapping[str, str]) -> tuple[str, ...]:
    """``flashinfer 0.6.7.post2 (was 0.6.3)``; the kernel with its package name."""
    def kernel(pins: Mapping[str, str]) -> str | None:
        return f"{pins.get('kernel_package', 'kernel')} {pins['kernel']}" if pins.get("kernel") else None
    moves = [f"{key} {after.get(key) or 'none'} (was {before.get(key) or 'none'})" for key in ("torch", "flashinfer")
             if before.get(key) != after.get(key)]
    if kernel(before) != kernel(after):
        moves.append(f"{kernel(after) or 'no kernel'} (was {kernel(before) or 'none'})")
    return tuple(moves)


def compare_pins(sglang: str, pins: Mapping[str, str], previous: str | None, previous_pins: Mapping[str, str] | None,
                 slots: Sequence[Slot], judge: Judge, features: Sequence[str],
                 rules: Mapping[str, Rule]) -> PinEffects:
    """What SGLang ``sglang``'s pins change against ``previous``'s: each release's derived stack judged in every
    slot. A feature is reported where the part of its judgement that the pins decide moved: the readings of the
    pinned releases, or a rule testing a pinned fact (:func:`through_pins`); a change that only the release's own
    version makes (a rule on ``sglang`` alone) is the watch's code comparison, not this. A stack that one side's
    pins can make and the other's cannot (pruned) is one line for the slot."""
    if previous is None or previous_pins is None:
        return PinEffects(sglang, previous, (), unjudged=(f"sglang {sglang}: no earlier release's pins to compare",))
    moves = pin_moves(previous_pins, pins)
    if not moves:
        return PinEffects(sglang, previous, ())
    changes, unjudged = [], []
    for slot in slots:
        before = judge.judge(previous, previous_pins, slot, features)
        after = judge.judge(sglang, pins, slot, features)
        if isinstance(before, str) or isinstance(after, str):
            unjudged.append(f"{slot.words}: " + "; ".join(
                f"{name} {why}" for name, why in (("before:", before), ("after:", after)) if isinstance(why, str)))
            continue
        pruned = [j for j in (before, after) if next(iter(j.values())).status == "pruned"] if features else []
        if pruned:
            first_before, first_after = before[features[0]], after[features[0]]
            if first_before.key != first_after.key:
                changes.append(PinChange(slot, _stack_judgement(first_before), _stack_judgement(first_after)))
            continue
        changes += [PinChange(slot, before[f], after[f]) for f in features
                    if _pin_key(before[f], rules) != _pin_key(after[f], rules)]
    return PinEffects(sglang, previous, moves, tuple(changes), tuple(unjudged), len(slots))


def _stack_judgement(judgement: Judgement) -> Judgement:
    """Whether the pins make a stack at all: pruned (by which rules) or kept."""
    if judgement.status == "pruned":
        return replace(judgement, feature="the stack", readings=())
    return Judgement("the stack", "kept", stack_id=judgement.stack_id)


def _pin_key(judgement: Judgement, rules: Mapping[str, Rule]) -> tuple[Any, ...]:
    """The part of a judgement the pins decide: the rules testing a pinned fact, the pinned releases' readings."""
    return (through_pins(judgement.rules, rules), _readings_key(judgement.readings))


def _readings_key(readings: Sequence[PinnedReading]) -> tuple[tuple[str, ReadingStatus], ...]:
    """Each fact's status: not the distribution (a renamed kernel package that reads the same is no change)."""
    return tuple(sorted((r.fact, r.status) for r in readings))


# --------------------------------------------------------------------------- the watch's wiring

def watch_pin_effects(releases: Sequence[Any], *, plan: Any, knowledge: Knowledge, pins_of: Callable[[str], Any],
                      read: ReadFn, readers: Sequence[ReaderSpec], features: Sequence[str]) -> dict[str, PinEffects]:
    """Per new SGLang release (a watch's :class:`~stackforge.watch.campaign.NewRelease`), what its pins change
    against the release before it, in every target x CUDA version of the watched matrix x flavour.

    ``pins_of(version)`` gives a release's pins (the table's row, else its METADATA read from the index), or
    ``None`` when it has none to read.
    """
    stacks = tuple(dict.fromkeys(cell.stack for cell in plan.cells))
    slots = slots_for(plan.targets, sorted({s.cuda for s in stacks}, key=parse_version), stacks)
    judge = Judge(knowledge, read, readers, dists=PINNED_DISTS)
    rules = {rule.id: rule for rule in knowledge.rules}
    effects = {}
    for release in releases:
        if release.dist != "sglang" or release.unread:
            continue
        pins = pins_of(release.version)
        previous = pins_of(release.previous) if release.previous else None
        if pins is None:
            effects[release.version] = PinEffects(release.version, release.previous, (),
                                                  unjudged=(f"sglang {release.version}: no wheel METADATA to read its "
                                                            "pins from",))
            continue
        effects[release.version] = compare_pins(release.version, pins, release.previous, previous, slots, judge,
                                                features, rules)
    return effects


@dataclass(frozen=True, slots=True)
class MemoRead:
    """A :data:`ReadFn` that reads each (reader, version, context) once through ``measure``."""

    measure: Callable[[ReaderSpec, str, ReadContext], Any]
    memo: dict[tuple[str, str, str, ReadContext], Any] = field(default_factory=dict)

    def __call__(self, spec: ReaderSpec, version: str, ctx: ReadContext) -> Any:
        key = (spec.dist, spec.fact, version, ctx)
        if key not in self.memo:
            self.memo[key] = self.measure(spec, version, ctx)
        return self.memo[key]




def with_pin_effects(releases: Sequence[Any], *, plan: Any, knowledge: Knowledge, indexes: Any, cache: Any,
                     listing: Sequence[Any]) -> list[Any]:
    """The watch's new releases, each new SGLang one with its :class:`PinEffects` (``pin_effects``): its pins from
    compat/sglang_pins.yaml, else its METADATA on the index (``listing``: SGLang's releases); the pinned releases
    read by the wheel tier through ``cache``.

    Raises:
        IndexUnreachableError: an index or a file host did not answer (exit 3).
    """
    if not any(r.dist == "sglang" and not r.unread for r in releases):
        return list(releases)
    from stackforge.plan.rules import FEATURES
    from stackforge.wheels.tier import load_readers

    effects = watch_pin_effects(releases, plan=plan, knowledge=knowledge,
                                pins_of=release_pins_reader(knowledge, listing, indexes=indexes, cache=cache),
                                read=pinned_reader(indexes=indexes, cache=cache), readers=load_readers(),
                                features=FEATURES)
    return [replace(r, pin_effects=effects[r.version]) if r.dist == "sglang" and r.version in effects else r
            for r in releases]


def release_pins_reader(knowledge: Knowledge, listing: Sequence[Any], *, indexes: Any,
                        cache: Any) -> Callable[[str], Mapping[str, str] | None]:
    """``pins_of(version)``: an SGLang release's pins, the generated table's row first (no network), else read
    from its METADATA on the index (a few KB; ``listing``: SGLang's releases); ``None`` when it has none."""
    from stackforge.plan.lock_resolve import read_release_pins

    by_version = {r.version: r for r in listing}
    memo: dict[str, Mapping[str, str] | None] = {}

    def pins_of(version: str) -> Mapping[str, str] | None:
        if version not in memo:
            row = knowledge.tables.sglang_pins.get(version)
            if row is None and version in by_version:
                locked = read_release_pins(by_version[version], indexes, cache.session)
                row = locked.as_row() if locked is not None else None
            memo[version] = row
        return memo[version]
    return pins_of


def pinned_reader(*, indexes: Any, cache: Any) -> MemoRead:
    """A :data:`ReadFn` over the index and the wheel cache: a pinned release the index lacks reads undecided."""
    from stackforge.edges.index import find_release, releases
    from stackforge.wheels.tier import LISTING_TTL_S, Measurement, measure

    listed: dict[str, list[Any]] = {}

    def measure_pinned(spec: ReaderSpec, version: str, ctx: ReadContext) -> Any:
        if spec.dist not in listed:
            listed[spec.dist] = releases(spec.dist, indexes=indexes, include_pre=True, include_yanked=True,
                                         session=cache.session, cache_dir=cache.index_dir, ttl_s=LISTING_TTL_S)
        release = find_release(listed[spec.dist], version)
        if release is None:
            return Measurement(spec.dist, version, Reading(spec.fact, ReadingStatus.UNDECIDED,
                                                           f"{spec.dist} {version} is not on the indexes"), None)
        return measure(spec, release, ctx, cache=cache)
    return MemoRead(measure_pinned)


# --------------------------------------------------------------------------- bisect --through-pins

@dataclass(frozen=True, slots=True)
class PinPoint:
    """One SGLang release judged through its own pins, as the search compares it (``reading``: the judgement's
    status and evidence as a verdict; ``file`` is ``None``: no one wheel speaks for a whole stack)."""

    version: str
    pins: Mapping[str, str] | None
    judgement: Judgement | None
    why_not: str = ""

    file = None

    @property
    def reading(self) -> Reading:
        judgement = self.judgement
        if judgement is None:
            return Reading("through-pins", ReadingStatus.UNDECIDED, self.why_not or "not judged")
        status = {"admitted": ReadingStatus.AVAILABLE, "unavailable": ReadingStatus.UNAVAILABLE,
                  "pruned": ReadingStatus.UNAVAILABLE, "hazard": ReadingStatus.AVAILABLE,
                  "unknown": ReadingStatus.UNDECIDED}[judgement.status]
        # The manner carries the evidence without versions: a rule or a pinned reading that moves is a change
        # even where the status stays.
        if judgement.status == "pruned":   # a stack its pins cannot make: which rules say so is no verdict
            return Reading(judgement.feature, status, f"{self.pins_words()}: {judgement.evidence}", manner="pruned")
        manner = "; ".join([judgement.status, *judgement.rules,
                            *(f"{fact} {status.value}" for fact, status in _readings_key(judgement.readings))])
        return Reading(judgement.feature, status, f"{self.pins_words()}: {judgement.evidence}", manner=manner)

    def pins_words(self) -> str:
        pins = self.pins or {}
        kernel = f", {pins.get('kernel_package', 'kernel')} {pins['kernel']}" if pins.get("kernel") else ""
        return f"torch {pins.get('torch', '?')}, flashinfer {pins.get('flashinfer', '?')}{kernel}"

    @property
    def status_word(self) -> str:
        return self.judgement.status if self.judgement is not None else "not judged"


def judge_through_pins(version: str, pins: Mapping[str, str] | None, slot: Slot, judge: Judge,
                       feature: str) -> PinPoint:
    """SGLang ``version`` with its own ``pins`` in ``slot``: ``feature``'s judgement (or why there is none)."""
    if pins is None:
        return PinPoint(version, None, None, "no wheel METADATA to read its pins from")
    judged = judge.judge(version, pins, slot, (feature,))
    if isinstance(judged, str):
        return PinPoint(version, pins, None, judged)
    return PinPoint(version, pins, judged[feature])


def newest_admitting(points: Sequence[Any]) -> tuple[str | None, bool]:
    """The newest release read whose pins keep the feature admitted, and whether that is certain: no later
    release read admits it, and the release after it was read (the boundary is exact). ``points``: a search's
    points (each ``.version`` and ``.result``: a :class:`PinPoint`)."""
    decided = [p for p in points if p.result.judgement is not None and p.result.judgement.status != "unknown"]
    admitted = [p for p in decided if p.result.judgement.status == "admitted"]
    if not admitted:
        return None, False
    newest = admitted[-1]
    later = [p for p in points if p.index > newest.index]
    return newest.version, not later or later[0].index == newest.index + 1


def write_pin_search(search: Any, *, feature: str, slot: Slot) -> str:
    """A through-pins search as text: what was read, the answer, each change with both sides' pins and evidence."""
    how = "every release read (--all)" if search.exhaustive else "binary search"
    span = f"{search.versions[0]} .. {search.versions[-1]}" if search.versions else "none"
    lines = [f"{feature} through sglang's own pins on {slot.words}: {len(search.versions)} release(s) {span}; "
             f"{len(search.points)} read, {how}"]
    newest, exact = newest_admitting(search.points)
    if newest is None:
        lines.append(f"no release read keeps {feature} admitted with its own pins")
    else:
        point = next(p for p in search.points if p.version == newest)
        lines.append(f"newest sglang whose own pins keep {feature} admitted: {newest} ({point.result.pins_words()})"
                     + ("" if exact else " (not every release after it was read; --all reads every release)"))
    if not search.changes:
        words = sorted({p.result.status_word for p in search.points})
        lines.append(f"no change found: every release read says {', '.join(words) or 'nothing'}")
    for change in search.changes:
        before, after = change.before.result, change.after.result
        skipped = (f" [not judged between: {', '.join(p.version for p in change.undecided)}]"
                   if change.undecided else "")
        moves = pin_moves(before.pins or {}, after.pins or {})
        lines += ["", f"sglang {before.version} ({before.status_word}) -> {after.version} ({after.status_word})"
                      f"{skipped}; pins: {', '.join(moves) or 'the same'}"]
        lines += [f"  {p.version}: {p.status_word}: {p.reading.summary}" for p in (before, after)]
        lines += [f"      {r.dist} {r.version} {r.fact}: {r.status.value}: {r.summary}"
                  + (f" [{r.site}]" if r.site else "")
                  for p in (before, after) if p.judgement for r in p.judgement.readings]
    undecided: dict[str, list[str]] = {}
    for p in search.points:
        if p.result.judgement is None or p.result.judgement.status == "unknown":
            undecided.setdefault(p.result.why_not or p.result.reading.summary, []).append(p.version)
    if undecided:
        lines.append("not judged: " + "; ".join(
            f"{versions[0]} ({why})" if len(versions) == 1 else f"{len(versions)} releases {versions[0]} .. "
            f"{versions[-1]} ({why})" for why, versions in undecided.items()))
    return "\n".join(lines)


def pin_search_json(search: Any, *, feature: str, slot: Slot) -> dict[str, Any]:
    """One slot's through-pins search for ``--json``."""
    def point(p: Any) -> dict[str, Any]:
        result = p.result
        return {"sglang": p.version, "pins": dict(result.pins or {}), "status": result.status_word,
                "judgement": result.judgement.to_json() if result.judgement else None, "why_not": result.why_not}
    newest, exact = newest_admitting(search.points)
    return {**slot.to_json(), "feature": feature, "mode": "all" if search.exhaustive else "binary",
            "releases": list(search.versions), "newest_admitting": newest, "newest_admitting_exact": exact,
            "read": [point(p) for p in search.points],
            "changes": [{"before": point(c.before), "after": point(c.after),
                         "undecided_between": [p.version for p in c.undecided]} for c in search.changes]}


__all__ = ["Judge", "Judgement", "MemoRead", "PinChange", "PinEffects", "PinPoint", "PinnedReading", "Slot",
           "compare_pins", "derived_stack", "judge_through_pins", "newest_admitting", "pin_moves", "pin_search_json",
           "pinned_reader", "release_pins_reader", "slots_for", "watch_pin_effects", "with_pin_effects",
           "write_pin_search"]
