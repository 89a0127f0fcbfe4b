"""The rule linter: rules that contradict each other, match every cell, or can never fire.

Pure functions over loaded rules (:mod:`stackforge.plan.rules`), shared by ``plan`` (every command that
plans), ``compat verify`` and a user ``--compat`` directory. Three kinds of problem, each named with the
rule(s) and their ``file:line``:

* **contradiction**: two ``requires`` rules that can fire on the same cell ask for incompatible things:
  driver ranges with no version in common (``>=600`` and ``<500``), or one environment variable set to two
  values (``NCCL_ALGO: Tree`` and ``NCCL_ALGO: Ring``). The planner would apply one and drop the other
  without a word.
* **matches everything**: a rule that prunes (``incompatible``) or blocks a feature (``feature_unavailable``)
  whose ``when`` every value satisfies (``when: {}``, ``gpu_count: {ge: 1}``, ``flashinfer: ">=0"``).
* **empty range**: a condition no value can satisfy (``>=0.6.7,<0.6.7``, ``>1,<1``, ``==1.0,!=1.0``,
  ``in: []``, ``gpu_count: {lt: 1}``), a ``requires.driver`` or a witness ``over`` that holds no version: the
  rule never fires, or proves nothing.

Version ranges are reasoned on as intervals (packaging's :class:`~packaging.ranges.VersionRange`, with the
pre-release policy :class:`~stackforge.plan.rules.Condition` uses), never by listing releases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from itertools import combinations
from typing import Any

from packaging.ranges import VersionRange
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from stackforge.core.errors import SpecError
from stackforge.plan.rules import FACT_KINDS, Condition, Effect, Rule, specifier_text

# Every real version is at least 0 (pre-releases of 0 aside): a range holding all of [0, +inf) matches
# every version a stack can have.
_EVERY_VERSION = VersionRange.from_bounds(Version("0"), None, prereleases=True)
# A cell's gpu_count comes from a target profile, which refuses anything below 1.
_GPU_COUNT_MIN = 1
# Effects that take something away from a cell: a `when` matching everything would take it from all.
_TAKING_EFFECTS = (Effect.INCOMPATIBLE, Effect.FEATURE_UNAVAILABLE)


class LintKind(str, Enum):
    """What is wrong with a rule (or a pair of rules)."""

    CONTRADICTION = "contradiction"
    MATCHES_EVERYTHING = "matches-everything"
    EMPTY_RANGE = "empty-range"


@dataclass(frozen=True, slots=True)
class LintProblem:
    """One problem, with the rule(s) it is about."""

    kind: LintKind
    rules: tuple[Rule, ...]
    text: str

    def line(self) -> str:
        """One line naming every rule with its ``file:line``."""
        named = " and ".join(f"{rule.id} ({rule.origin or 'no file'})" for rule in self.rules)
        return f"{'rules' if len(self.rules) > 1 else 'rule'} {named}: {self.text}"


def check_rules(rules: Sequence[Rule]) -> None:
    """Refuse a rule set the linter finds a problem in.

    Raises:
        SpecError: (exit 2) the first problem in one line, naming both rules of a contradiction with
            their ``file:line``, and how many more there are.
    """
    problems = lint_rules(rules)
    if not problems:
        return
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    raise SpecError(problems[0].line() + more, remedy=_REMEDIES[problems[0].kind])


_REMEDIES = {
    LintKind.CONTRADICTION: "narrow one rule's when so the two never fire on one cell, or drop one",
    LintKind.MATCHES_EVERYTHING: "give the rule the conditions it is about (arch, versions, hardware)",
    LintKind.EMPTY_RANGE: "fix the range: no version (or value) satisfies it, so the rule never fires",
}


def lint_rules(rules: Sequence[Rule]) -> tuple[LintProblem, ...]:
    """Every problem in ``rules``: empty ranges and catch-all rules first (one rule each), then the
    contradictions between two rules, in rule order."""
    problems = [problem for rule in rules for problem in _rule_problems(rule)]
    requiring = [rule for rule in rules if rule.requires and not _never_fires(rule)]
    problems += [problem for first, second in combinations(requiring, 2)
                 if (problem := _contradiction(first, second)) is not None]
    return tuple(problems)


# --------------------------------------------------------------------------- one rule


def _rule_problems(rule: Rule) -> list[LintProblem]:
    problems = [LintProblem(LintKind.EMPTY_RANGE, (rule,),
                            f"{_condition_text(c)} holds no value: the rule never fires")
                for c in rule.conditions if _values(c).empty]
    driver = rule.requires.get("driver")
    if driver is not None and _version_range(SpecifierSet(str(driver))).is_empty:
        problems.append(LintProblem(LintKind.EMPTY_RANGE, (rule,),
                                    f"requires driver {driver!r} holds no version: no driver satisfies it"))
    witness = rule.witness
    if witness is not None and witness.over is not None and _version_range(witness.over).is_empty:
        over = specifier_text(witness.over)
        problems.append(LintProblem(LintKind.EMPTY_RANGE, (rule,),
                                    f"witness over {over!r} holds no version: it checks nothing"))
    if rule.effect in _TAKING_EFFECTS and all(_values(c).universal for c in rule.conditions):
        conditions = ", ".join(_condition_text(c) for c in rule.conditions)
        what = f"a when every value satisfies ({conditions})" if conditions else "an empty when"
        taken = ("prunes every cell" if rule.effect is Effect.INCOMPATIBLE
                 else f"makes {rule.feature} unavailable everywhere")
        problems.append(LintProblem(LintKind.MATCHES_EVERYTHING, (rule,), f"{what}: it {taken}"))
    return problems


def _never_fires(rule: Rule) -> bool:
    return any(_values(c).empty for c in rule.conditions)


# --------------------------------------------------------------------------- two rules


def _contradiction(first: Rule, second: Rule) -> LintProblem | None:
    """What two ``requires`` rules ask that cannot both hold, when some cell fires both (else None)."""
    clashes: list[str] = []
    driver_a, driver_b = first.requires.get("driver"), second.requires.get("driver")
    if driver_a is not None and driver_b is not None:
        first_range, second_range = (_version_range(SpecifierSet(str(d))) for d in (driver_a, driver_b))
        if first_range.intersection(second_range).is_empty:
            clashes.append(f"driver {driver_a} against driver {driver_b}: no driver satisfies both")
    env_a, env_b = first.requires.get("env") or {}, second.requires.get("env") or {}
    clashes += [f"{name}={env_a[name]} against {name}={env_b[name]}"
                for name in sorted(set(env_a) & set(env_b)) if str(env_a[name]) != str(env_b[name])]
    if not clashes or not _can_fire_together(first, second):
        return None
    return LintProblem(LintKind.CONTRADICTION, (first, second),
                       f"contradictory requirements on the same cells ({'; '.join(clashes)})")


def _can_fire_together(first: Rule, second: Rule) -> bool:
    """Whether some cell satisfies both rules' conditions: every fact both test has a value both accept
    (a fact one rule leaves open takes any value)."""
    by_fact = {c.fact: c for c in second.conditions}
    return all(not _values(c).meet(_values(by_fact[c.fact])).empty
               for c in first.conditions if c.fact in by_fact)


# --------------------------------------------------------------------------- the values a condition accepts


@dataclass(frozen=True, slots=True)
class _Values:
    """The values of one fact a condition accepts: a version range; or a set of members (``negated``:
    everything but them), for integers also within ``low``..``high`` (inclusive, None: unbounded)."""

    versions: VersionRange | None = None
    members: frozenset[Any] | None = None   # None: no set condition
    negated: bool = False
    integer: bool = False
    low: int | None = None
    high: int | None = None

    @property
    def empty(self) -> bool:
        if self.versions is not None:
            return self.versions.is_empty
        if self.low is not None and self.high is not None and self.low > self.high:
            return True
        if self.members is None or self.negated:
            return False
        return not any(self._in_range(m) for m in self.members)

    @property
    def universal(self) -> bool:
        if self.versions is not None:
            return _EVERY_VERSION.is_subset(self.versions)
        if self.integer and ((self.low is not None and self.low > _GPU_COUNT_MIN) or self.high is not None):
            return False
        return self.members is None or (self.negated and not any(self._in_range(m) for m in self.members))

    def _in_range(self, value: Any) -> bool:
        if not self.integer:
            return True
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def meet(self, other: _Values) -> _Values:
        """The values both accept."""
        if self.versions is not None and other.versions is not None:
            return _Values(versions=self.versions.intersection(other.versions))
        if self.versions is not None or other.versions is not None:
            return self   # two forms of one fact that never mix (a loader guarantee): nothing to narrow
        low = max((v for v in (self.low, other.low) if v is not None), default=None)
        high = min((v for v in (self.high, other.high) if v is not None), default=None)
        members, negated = _meet_members(self, other)
        return _Values(members=members, negated=negated, integer=self.integer, low=low, high=high)


def _meet_members(first: _Values, second: _Values) -> tuple[frozenset[Any] | None, bool]:
    if first.members is None or second.members is None:
        held = first if second.members is None else second
        return held.members, held.negated
    if first.negated and second.negated:
        return first.members | second.members, True
    if first.negated or second.negated:
        kept, dropped = (second, first) if first.negated else (first, second)
        return kept.members - dropped.members, False   # type: ignore[operator]
    return first.members & second.members, False


def _values(condition: Condition) -> _Values:
    """The values ``condition`` accepts."""
    op, operand = condition.op, condition.operand
    kind = FACT_KINDS.get(condition.fact, "identifier")
    if kind == "version":
        if op in ("spec", "not_spec"):
            accepted = _version_range(operand)
            return _Values(versions=accepted if op == "spec" else accepted.complement())
        points = VersionRange.empty(prereleases=True)
        for member in operand:
            points = points.union(VersionRange.singleton(Version(str(member)), prereleases=True))
        return _Values(versions=points if op == "in" else points.complement())
    if kind == "number":
        # A cell's gpu_count comes from a target profile, which refuses anything below 1.
        if op in ("in", "not_in"):
            return _Values(members=frozenset(operand), negated=op == "not_in", integer=True,
                           low=_GPU_COUNT_MIN)
        low, high = {"eq": (operand, operand), "gt": (operand + 1, None), "ge": (operand, None),
                     "lt": (None, operand - 1), "le": (None, operand)}[op]
        floor = _GPU_COUNT_MIN if low is None else max(low, _GPU_COUNT_MIN)
        return _Values(integer=True, low=floor, high=high)
    members = frozenset(operand) if op in ("in", "not_in") else frozenset({operand})
    return _Values(members=members, negated=op == "not_in")


def _version_range(spec: SpecifierSet) -> VersionRange:
    """The versions ``spec`` accepts, pre-releases included as :meth:`Condition.holds` includes them."""
    return SpecifierSet(str(spec), prereleases=True).to_range()


def _condition_text(condition: Condition) -> str:
    operand = condition.operand
    if isinstance(operand, SpecifierSet):
        text = repr(specifier_text(operand))
        return f"{condition.fact}: {text}" if condition.op == "spec" else f"{condition.fact}: not {text}"
    if isinstance(operand, frozenset):
        return f"{condition.fact}: {condition.op} {sorted(str(v) for v in operand)}"
    if condition.op == "eq":
        return f"{condition.fact}: {operand!r}"
    return f"{condition.fact}: {condition.op} {operand!r}"
