"""``stackforge compat verify``: every rule a wheel reader can witness, checked in the releases on both
sides of each of its version bounds.

A rule's ``witness`` names the reading that decides it (a fact read from a distribution's wheels) and
the reading status expected inside the rule's bound. For each bound on that distribution the releases
checked are the last release outside, the first inside, the last inside and the first outside (those
that exist), for each of the rule's own targets (the targets in ``compat/targets.yaml`` its hardware
conditions match). A rule is CONFIRMED when every release inside reads as expected and every release
outside reads otherwise, HALF-WITNESSED when what was read agrees but a release at a bound stayed undecided
(an sdist-only release, say: the report names that side), WRONG when one does not (with the bound the
readings show, found by a binary search between the releases checked), UNWITNESSED when no reader can
decide it (with why), EMPTY when its range holds no release on the index (it can never fire: an error).

The module is pure: wheels are read through an injected evaluator ``(fact, dist, version, ctx) ->
Reading`` and releases listed through ``(dist) -> versions``, so the logic is tested without network.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from packaging.specifiers import SpecifierSet

from stackforge.core.model import Target
from stackforge.core.versions import parse_version
from stackforge.core.wheel_readings import CodeSite, ReadContext, Reading, ReadingStatus
from stackforge.plan.rules import Condition, Rule, Witness

Evaluate = Callable[[str, str, str, ReadContext], Reading]
ListReleases = Callable[[str], Sequence[str]]

# Hardware conditions a target answers; a rule's own targets are those that satisfy all of them.
TARGET_FACTS = ("arch", "gpu_count", "interconnect", "multicast", "target")
# Stack conditions a reading can depend on: a value inside the condition is chosen from these
# candidates (the highest that satisfies it, so "<12.9" reads as 12.8), or the witness context gives one.
CONTEXT_CANDIDATES: dict[str, tuple[str, ...]] = {
    "cuda": ("12.4", "12.6", "12.8", "12.9", "13.0", "13.1", "13.2"),
    "torch_cuda": ("12.4", "12.6", "12.8", "12.9", "13.0", "13.2"),
    "python": ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13"),
}
CONTEXT_FACTS = ("cuda", "nvcc", "torch_cuda", "python", "kernel_package")


class WitnessResult(str, Enum):
    """What the wheels say about one rule."""

    CONFIRMED = "confirmed"              # every release read at the bounds decided, and agrees
    HALF_WITNESSED = "half-witnessed"    # what decided agrees, but a side of a bound stayed undecided (named)
    WRONG = "wrong"
    UNWITNESSED = "unwitnessed"
    EMPTY = "empty"                      # the rule's range holds no release on the index: it can never fire


@dataclass(frozen=True, slots=True)
class BoundCheck:
    """One release read for one context, and whether it agrees with the rule."""

    version: str
    role: str                 # "last release outside", "first release inside", ...
    inside: bool              # the rule covers this release
    targets: tuple[str, ...]  # the targets this context stands for
    reading: Reading
    agrees: bool | None       # None: the reader could not decide

    def to_json(self) -> dict[str, Any]:
        reading = self.reading
        return {"version": self.version, "role": self.role, "inside": self.inside, "targets": list(self.targets),
                "status": reading.status.value, "summary": reading.summary, "agrees": self.agrees,
                "sites": [{"path": s.path, "line": s.line, "code": s.code} for s in reading.sites]}


@dataclass(frozen=True, slots=True)
class MeasuredBound:
    """Where the reading actually changes between two releases next to each other (or that it does not)."""

    targets: tuple[str, ...]
    before: str | None        # last release reading the other way (None: none in the window)
    after: str | None         # first release reading the new way
    before_status: str
    after_status: str
    text: str
    # The reading turns to what the rule expects inside at ``after`` (a lower bound, ``>=after``), or
    # away from it (an upper bound, ``<after``); None when no change was found.
    enters: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {"targets": list(self.targets), "before": self.before, "after": self.after,
                "before_status": self.before_status, "after_status": self.after_status, "text": self.text}


@dataclass(frozen=True, slots=True)
class RuleCheck:
    """One rule checked against the wheels: its result, every release read and, when WRONG, the measured
    bounds (serialized with the result under the JSON key ``verdict``)."""

    rule_id: str
    result: WitnessResult
    why: str
    bound: str = ""                       # "sglang >=0.5.14"
    contexts: tuple[str, ...] = ()        # how each read context was chosen
    checks: tuple[BoundCheck, ...] = ()
    measured: tuple[MeasuredBound, ...] = ()
    witness: Witness | None = None

    def to_json(self) -> dict[str, Any]:
        witness = self.witness
        return {"rule": self.rule_id, "verdict": self.result.value, "why": self.why, "bound": self.bound,
                "witness": None if witness is None else {
                    "dist": witness.dist, "fact": witness.fact, "inside": [s.value for s in witness.inside],
                    "context": dict(witness.context)},
                "contexts": list(self.contexts), "checks": [c.to_json() for c in self.checks],
                "measured": [m.to_json() for m in self.measured]}


@dataclass(frozen=True, slots=True)
class RuleVerification:
    """Every rule's check; ``witnessed`` counts the rules a reading decided (confirmed or wrong)."""

    rules: tuple[RuleCheck, ...]

    def count(self, result: WitnessResult) -> int:
        return sum(1 for v in self.rules if v.result is result)

    @property
    def witnessed(self) -> int:
        return (self.count(WitnessResult.CONFIRMED) + self.count(WitnessResult.HALF_WITNESSED)
                + self.count(WitnessResult.WRONG))

    @property
    def ok(self) -> bool:
        return self.count(WitnessResult.WRONG) == 0 and self.count(WitnessResult.EMPTY) == 0

    def empty_ranges(self) -> tuple[str, ...]:
        """One line per rule whose range holds no release on the index (each an error)."""
        return tuple(f"rule {v.rule_id}: {v.why}" for v in self.rules if v.result is WitnessResult.EMPTY)

    def to_json(self) -> dict[str, Any]:
        return {"witnessed": self.witnessed, "total": len(self.rules),
                "confirmed": self.count(WitnessResult.CONFIRMED),
                "half_witnessed": self.count(WitnessResult.HALF_WITNESSED), "wrong": self.count(WitnessResult.WRONG),
                "unwitnessed": self.count(WitnessResult.UNWITNESSED),
                "empty": self.count(WitnessResult.EMPTY), "rules": [v.to_json() for v in self.rules]}


@dataclass(frozen=True, slots=True)
class _Context:
    ctx: ReadContext
    targets: tuple[str, ...]
    note: str


@dataclass(slots=True)
class _Reader:
    """The evaluator with a memo: a release is read once per context however many rules ask."""

    evaluate: Evaluate
    memo: dict[tuple[str, str, str, ReadContext], Reading] = field(default_factory=dict)

    def read(self, witness: Witness, version: str, ctx: ReadContext) -> Reading:
        key = (witness.fact, witness.dist, version, ctx)
        if key not in self.memo:
            self.memo[key] = self.evaluate(witness.fact, witness.dist, version, ctx)
        return self.memo[key]


# --------------------------------------------------------------------------- entry point

def verify_rules(rules: Sequence[Rule], targets: Mapping[str, Target], *, evaluate: Evaluate,
                 list_releases: ListReleases) -> RuleVerification:
    """Verify each rule (see the module docstring); releases are listed once per distribution."""
    reader = _Reader(evaluate)
    releases: dict[str, tuple[str, ...]] = {}

    def releases_of(dist: str) -> tuple[str, ...]:
        if dist not in releases:
            releases[dist] = tuple(sorted(list_releases(dist), key=parse_version))
        return releases[dist]

    return RuleVerification(tuple(verify_rule(rule, targets, reader=reader, releases_of=releases_of) for rule in rules))


def verify_rule(rule: Rule, targets: Mapping[str, Target], *, reader: _Reader,
                releases_of: Callable[[str], tuple[str, ...]]) -> RuleCheck:
    """The check of one rule."""
    witness = rule.witness
    if witness is None:
        return RuleCheck(rule.id, WitnessResult.UNWITNESSED, unwitnessed_reason(rule))
    contexts = rule_contexts(rule, witness, targets)
    if isinstance(contexts, str):
        return RuleCheck(rule.id, WitnessResult.UNWITNESSED, contexts, witness=witness)
    conditions = tuple(c for c in rule.conditions if c.fact == witness.version_fact)
    all_releases = releases_of(witness.dist)
    window = tuple(v for v in all_releases if witness.over is None or witness.over.contains(v, prereleases=True))
    bound = _bound_text(witness, conditions)
    if not all_releases:
        # The index has none of this distribution at all: that says nothing about the rule's range.
        return RuleCheck(rule.id, WitnessResult.UNWITNESSED, f"no {witness.dist} release on the index",
                         bound=bound, witness=witness)
    inside = tuple(all(c.holds(v) for c in conditions) for v in window)
    if not any(inside):
        # A range no release falls in never fires (an empty or mistyped bound, a patch that closed it):
        # an error, never a rule left unchecked.
        where = bound if window else f"{bound + ' over ' if bound else ''}{witness.over}"
        why = (f"range {where} holds no release of {witness.dist} on the index "
               f"(releases {all_releases[0]}..{all_releases[-1]})")
        return RuleCheck(rule.id, WitnessResult.EMPTY, why, bound=bound, witness=witness)
    points = bound_points(inside)
    checks = tuple(_check(reader, witness, window, index, role, inside[index], context)
                   for index, role in points for context in contexts)
    notes = tuple(c.note for c in contexts)
    wrong = [c for c in checks if c.agrees is False]
    if wrong:
        measured = tuple(m for check in wrong for m in _measure(reader, witness, window, inside, check, contexts))
        why = "; ".join(f"{c.version} ({c.role}) reads {c.reading.status.value} for {','.join(c.targets)}"
                        for c in wrong)
        return RuleCheck(rule.id, WitnessResult.WRONG, why, bound=bound, contexts=notes, checks=checks,
                         measured=_unique(measured), witness=witness)
    undecided = [c for c in checks if c.agrees is None]
    undecided_note = (f"undecided at {witness.dist} {', '.join(dict.fromkeys(c.version for c in undecided))}: "
                      f"{undecided[0].reading.summary}" if undecided else "")
    agreed = sum(1 for c in checks if c.agrees)
    if not agreed:
        return RuleCheck(rule.id, WitnessResult.UNWITNESSED, f"reader {undecided_note}", bound=bound, contexts=notes,
                         checks=checks, witness=witness)
    if undecided:
        # One side of a bound read, the other not (an sdist-only release, a file the reader did not expect):
        # the bound is only half checked, and the report names the side.
        sides = "; ".join(dict.fromkeys(f"{c.role} {c.version} undecided: {c.reading.summary}" for c in undecided))
        return RuleCheck(rule.id, WitnessResult.HALF_WITNESSED, f"{agreed} reading(s) agree; {sides}",
                         bound=bound, contexts=notes, checks=checks, witness=witness)
    return RuleCheck(rule.id, WitnessResult.CONFIRMED, f"{agreed} reading(s) agree", bound=bound, contexts=notes,
                     checks=checks, witness=witness)


def touched_by_release(rule: Rule, dist: str, version: str, versions: Sequence[str]) -> bool:
    """Whether ``dist`` ``version`` sits at one of ``rule``'s bounds among ``versions`` (the releases known,
    oldest first): it is the last release outside, first or last inside, or first outside of a run of
    releases the rule covers. A release there can move the bound, so the rule is read again."""
    witness = rule.witness
    if witness is None or witness.dist != dist:
        return False
    window = [v for v in versions if witness.over is None or witness.over.contains(v, prereleases=True)]
    if version not in window:
        return False
    conditions = [c for c in rule.conditions if c.fact == witness.version_fact]
    inside = [all(c.holds(v) for c in conditions) for v in window]
    return any(inside) and version in {window[i] for i, _ in bound_points(inside)}


def unwitnessed_reason(rule: Rule) -> str:
    """Why a rule without a witness is not checked: what its data says, or what it lacks."""
    if rule.unwitnessed:
        return rule.unwitnessed
    if not any(c.fact in ("flashinfer", "sglang", "kernel") for c in rule.conditions):
        return "no version bound on a wheel-read distribution and no reader for its fact"
    return "no wheel reader for this fact"


# --------------------------------------------------------------------------- contexts

def rule_contexts(rule: Rule, witness: Witness, targets: Mapping[str, Target]) -> tuple[_Context, ...] | str:
    """The read contexts of a rule's own targets (one per distinct context), or why there are none."""
    stack: dict[str, Any] = {}
    notes: list[str] = []
    for fact in CONTEXT_FACTS:
        conditions = [c for c in rule.conditions if c.fact == fact]
        if fact in witness.context:
            stack[fact] = witness.context[fact]
            notes.append(f"{fact}={witness.context[fact]} (witness context)")
        elif conditions:
            value = _value_inside(fact, conditions)
            if value is None:
                return f"no {fact} value satisfies the rule's condition"
            stack[fact] = value
            notes.append(f"{fact}={value} (inside the rule's condition)")
    hardware = {k: v for k, v in witness.context.items() if k not in CONTEXT_FACTS}
    # A witness context that names the arch describes a GPU no target has (sm_121): read for it alone.
    # Other hardware values stand in for the target's (a 6-GPU reading of the PCIe boxes), said in the name.
    own = [] if "arch" in hardware else [t for t in targets.values() if _target_matches(rule, t, hardware)]
    by_ctx: dict[ReadContext, list[str]] = {}
    for target in own:
        base = ReadContext(arch=target.arch, gpu_count=target.gpu_count, interconnect=target.interconnect.value,
                           multicast=target.multicast)
        ctx = replace(base, **stack, **hardware)
        changed = [f"{k}={v}" for k, v in hardware.items() if getattr(base, k) != v]
        by_ctx.setdefault(ctx, []).append(target.name + (f" as {','.join(changed)}" if changed else ""))
    if not by_ctx:
        if not {"arch", "gpu_count", "interconnect"} <= set(hardware):
            return "no target in targets.yaml matches the rule's hardware conditions"
        ctx = ReadContext(**{"multicast": False, **hardware, **stack})
        outside = [c.fact for c in rule.conditions
                   if c.fact in TARGET_FACTS and c.fact != "target" and not c.holds(getattr(ctx, c.fact))]
        if outside:
            return f"the witness context's {', '.join(outside)} is outside the rule's own conditions"
        by_ctx[ctx] = [f"arch {ctx.arch} x{ctx.gpu_count} {ctx.interconnect} (witness context)"]
    note = "; ".join(notes)
    return tuple(_Context(ctx, tuple(names), note) for ctx, names in by_ctx.items())


def _target_matches(rule: Rule, target: Target, hardware: Mapping[str, Any]) -> bool:
    facts = {"arch": target.arch, "gpu_count": target.gpu_count, "interconnect": target.interconnect.value,
             "multicast": target.multicast, "target": target.name, **hardware}
    return all(c.holds(facts[c.fact]) for c in rule.conditions if c.fact in TARGET_FACTS)


def _value_inside(fact: str, conditions: list[Condition]) -> Any:
    """A value every condition on ``fact`` holds for: the condition's own value for booleans and names,
    the highest candidate version otherwise."""
    if fact in ("nvcc", "kernel_package"):
        values = [c.operand for c in conditions if c.op == "eq"]
        return values[0] if values and all(c.holds(values[0]) for c in conditions) else None
    inside = [v for v in CONTEXT_CANDIDATES[fact] if all(c.holds(v) for c in conditions)]
    return inside[-1] if inside else None


# --------------------------------------------------------------------------- releases to read

def bound_points(inside: Sequence[bool]) -> tuple[tuple[int, str], ...]:
    """The releases on both sides of each bound: for every run of releases inside the rule, the last
    release outside before it, its first and last release, and the first release outside after it."""
    points: dict[int, str] = {}
    index = 0
    while index < len(inside):
        if not inside[index]:
            index += 1
            continue
        start = index
        while index < len(inside) and inside[index]:
            index += 1
        end = index - 1
        if start > 0:
            points.setdefault(start - 1, "last release outside")
        points.setdefault(start, "first release inside")
        points.setdefault(end, "last release inside")
        if end + 1 < len(inside):
            points.setdefault(end + 1, "first release outside")
    return tuple(sorted(points.items()))


def _check(reader: _Reader, witness: Witness, window: Sequence[str], index: int, role: str, inside: bool,
           context: _Context) -> BoundCheck:
    reading = reader.read(witness, window[index], context.ctx)
    return BoundCheck(version=window[index], role=role, inside=inside, targets=context.targets, reading=reading,
                      agrees=_agrees(witness, reading, inside))


def _agrees(witness: Witness, reading: Reading, inside: bool) -> bool | None:
    if reading.status is ReadingStatus.UNDECIDED and ReadingStatus.UNDECIDED not in witness.inside:
        return None
    return reads_inside(witness, reading) == inside


def reads_inside(witness: Witness, reading: Reading) -> bool:
    """Whether a reading is what the rule expects inside its bound: the status, and the code it shows."""
    if reading.status not in witness.inside:
        return False
    if not witness.shows:
        return True
    return witness.shows in reading.summary or any(witness.shows in site.code for site in reading.sites)


# --------------------------------------------------------------------------- measuring the real bound

def _measure(reader: _Reader, witness: Witness, window: Sequence[str], inside: Sequence[bool], check: BoundCheck,
             contexts: Sequence[_Context]) -> tuple[MeasuredBound, ...]:
    """Where the reading changes near a release that disagrees with the rule.

    The search window spans the run of releases the failing release belongs to and the run next to it
    across the rule's bound; :func:`stackforge.wheels.bisect.binary_search` finds where "reads as the
    rule expects inside" flips in it (undecided releases stepped over, a few releases sampled when the
    ends agree)."""
    from stackforge.wheels.bisect import binary_search

    context = next(c for c in contexts if c.targets == check.targets)
    lo, hi = _neighbour_runs(inside, window.index(check.version))
    search = binary_search(window[lo:hi + 1], lambda version: _Match.of(reader, witness, version, context.ctx))
    fact = witness.version_fact
    bounds = []
    for change in search.changes:
        before, after = change.before.result.original, change.after.result.original
        claim = f"{fact} >={change.after.version}" if change.after.result.matches else f"{fact} <{change.after.version}"
        skipped = f" ({len(change.undecided)} undecided release(s) between)" if change.undecided else ""
        text = (f"reading turns {after.status.value} at {change.after.version} (from {before.status.value} at "
                f"{change.before.version}){skipped}: measured bound {claim}")
        bounds.append(MeasuredBound(context.targets, change.before.version, change.after.version,
                                    before.status.value, after.status.value, text, change.after.result.matches))
    if not bounds:
        decided = [p for p in search.points if p.decided]
        first, last = (decided[0], decided[-1]) if decided else (search.points[0], search.points[-1])
        expected = "/".join(s.value for s in witness.inside)
        verb = "read" if first.result.matches else "read neither"
        text = (f"{first.version} ({first.result.original.status.value}) and {last.version} "
                f"({last.result.original.status.value}) both {verb} {expected}, and so do the {len(decided)} "
                f"release(s) read between: the reading does not change across {fact} {first.version}..{last.version} "
                f"the way the rule says")
        bounds.append(MeasuredBound(context.targets, None, None, first.result.original.status.value,
                                    last.result.original.status.value, text))
    return tuple(bounds)


@dataclass(frozen=True, slots=True)
class _Match:
    """A reading seen as what the search compares: reads as the rule expects inside, or not (or undecided)."""

    reading: Reading
    original: Reading
    matches: bool

    @classmethod
    def of(cls, reader: _Reader, witness: Witness, version: str, ctx: ReadContext) -> _Match:
        original = reader.read(witness, version, ctx)
        matches = reads_inside(witness, original)
        if original.status is ReadingStatus.UNDECIDED and ReadingStatus.UNDECIDED not in witness.inside:
            status = ReadingStatus.UNDECIDED
        else:
            status = ReadingStatus.AVAILABLE if matches else ReadingStatus.UNAVAILABLE
        return cls(replace(original, status=status, manner=""), original, matches)


def _neighbour_runs(inside: Sequence[bool], index: int) -> tuple[int, int]:
    """The span of the run holding ``index`` plus the run beside it across the bound nearest ``index``."""
    start = index
    while start > 0 and inside[start - 1] == inside[index]:
        start -= 1
    end = index
    while end + 1 < len(inside) and inside[end + 1] == inside[index]:
        end += 1
    # Extend across the nearer bound of the run (a failing first/last release sits next to one).
    if index - start <= end - index and start > 0:
        other = start - 1
        while other > 0 and inside[other - 1] == inside[start - 1]:
            other -= 1
        return other, end
    if end + 1 < len(inside):
        other = end + 1
        while other + 1 < len(inside) and inside[other + 1] == inside[end + 1]:
            other += 1
        return start, other
    if start > 0:
        other = start - 1
        while other > 0 and inside[other - 1] == inside[start - 1]:
            other -= 1
        return other, end
    return start, end


def _bound_text(witness: Witness, conditions: Sequence[Condition]) -> str:
    if not conditions:
        return f"{witness.version_fact} {witness.over}" if witness.over is not None else f"any {witness.version_fact}"
    parts = []
    for condition in conditions:
        operand = condition.operand
        if isinstance(operand, SpecifierSet):
            # Lower bounds first: ">=0.5.3,<0.5.14".
            text = ",".join(str(s) for s in sorted(operand, key=lambda s: (parse_version(s.version), s.operator[0] != ">")))
            parts.append(text if condition.op == "spec" else f"not {text}")
        else:
            parts.append(f"{condition.op} {sorted(str(v) for v in operand)}")
    return f"{witness.version_fact} {' and '.join(parts)}"


def _unique(measured: Sequence[MeasuredBound]) -> tuple[MeasuredBound, ...]:
    """One entry per distinct measurement, naming every target it was measured for."""
    merged: dict[tuple[Any, ...], MeasuredBound] = {}
    for m in measured:
        key = (m.before, m.after, m.text)
        if key in merged:
            targets = merged[key].targets + tuple(t for t in m.targets if t not in merged[key].targets)
            merged[key] = replace(merged[key], targets=targets)
        else:
            merged[key] = m
    return tuple(merged.values())


# --------------------------------------------------------------------------- text

def write_verification_text(report: RuleVerification) -> str:
    """One line per rule; a WRONG rule also shows the releases that disagree and the measured bound."""
    lines: list[str] = []
    for v in report.rules:
        head = f"{v.result.value.upper():<14} {v.rule_id}"
        if v.result in (WitnessResult.UNWITNESSED, WitnessResult.EMPTY):
            lines.append(f"{head}: {v.why}")
            continue
        witness = v.witness
        assert witness is not None
        shows = f" showing {witness.shows!r}" if witness.shows else ""
        lines.append(f"{head}: {v.bound}; {witness.fact} from {witness.dist} reads "
                     f"{'/'.join(s.value for s in witness.inside)}{shows} inside")
        if v.result is WitnessResult.HALF_WITNESSED:
            lines.append(f"    half-witnessed: {v.why}")
        if v.contexts and v.contexts[0]:
            lines.append(f"    read with {v.contexts[0]}")
        for check, targets in _grouped(v.checks):
            mark = {True: "ok", False: "WRONG", None: "??"}[check.agrees]
            site = check.reading.sites[0] if check.reading.sites else None
            where = f" {_cited(site)}" if site and _cited(site) not in check.reading.summary else ""
            on = f" [{', '.join(targets)}]" if v.result is WitnessResult.WRONG else ""
            lines.append(f"    {mark:<5} {check.version:<14} {check.role:<22} {check.reading.status.value:<11}"
                         f"{where} {check.reading.summary}{on}".rstrip())
        for m in v.measured:
            lines.append(f"    measured ({', '.join(m.targets)}): {m.text}")
    lines.append(f"witnessed {report.witnessed} / {len(report.rules)} rules: "
                 f"{report.count(WitnessResult.CONFIRMED)} confirmed, "
                 f"{report.count(WitnessResult.HALF_WITNESSED)} half-witnessed, {report.count(WitnessResult.WRONG)} wrong, "
                 f"{report.count(WitnessResult.UNWITNESSED)} unwitnessed"
                 + (f", {empty} empty" if (empty := report.count(WitnessResult.EMPTY)) else ""))
    return "\n".join(lines)


def _cited(site: CodeSite) -> str:
    """``path:line``; a line-0 site is an absence: ``path (not in this release)``, or what the file lacks."""
    return f"{site.path}:{site.line}" if site.line else f"{site.path} ({site.code or 'not in this release'})"


def _grouped(checks: Sequence[BoundCheck]) -> list[tuple[BoundCheck, tuple[str, ...]]]:
    """Checks that read the same for several contexts, once, with every target they stand for."""
    groups: dict[tuple[Any, ...], tuple[BoundCheck, list[str]]] = {}
    for check in checks:
        key = (check.version, check.role, check.reading.status, check.reading.summary, check.agrees)
        if key not in groups:
            groups[key] = (check, [])
        groups[key][1].extend(check.targets)
    return [(check, tuple(targets)) for check, targets in groups.values()]
