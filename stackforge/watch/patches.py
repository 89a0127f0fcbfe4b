"""A patch to ``compat/rules`` for a rule a new release proved wrong: the bound that now applies, its evidence.

Pure: given the rule, its check by :func:`stackforge.wheels.verify.verify_rules` and the text of
the rule's file, it returns a unified diff a person can review and apply (``git apply``), or, where the
readings call for more than moving a bound (a refusal that comes back after a fix), the words of what
the readings show and no diff. A patch is a proposal: it is printed in the watch report and never
written to ``compat/`` by stackforge.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace
from typing import Any

from packaging.specifiers import Specifier, SpecifierSet
from packaging.version import Version

from stackforge.plan.rule_lint import lint_rules
from stackforge.plan.rules import Condition, Rule
from stackforge.wheels.bisect import site_text
from stackforge.wheels.verify import BoundCheck, MeasuredBound, RuleCheck, WitnessResult, reads_inside

PYPI_PROJECT = "https://pypi.org/project"


@dataclass(frozen=True, slots=True)
class ProposedPatch:
    """What to change in a rule, why, and the diff (``""`` where a person must write the change)."""

    rule_id: str
    file: str                  # compat/rules/flashinfer.yaml
    summary: str               # one line: the bound now, the bound proposed, the release that moved it
    evidence: tuple[str, ...]  # path:line: code lines of the reading that moved it, and the wheel
    diff: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule_id, "file": self.file, "summary": self.summary, "evidence": list(self.evidence),
                "diff": self.diff}


def propose_patch(rule: Rule, rule_check: RuleCheck, version: str, rule_file_text: str) -> ProposedPatch | None:
    """The patch for ``rule`` after release ``version`` read against it; ``None`` when the rule still holds.

    The readings' measured bounds say where the reading turns to what the rule expects inside (a lower
    bound, ``>=V``) and where it turns away (an upper bound, ``<V``). The patch moves the rule's lower
    bound, upper bound or both to them (an ``==V`` or ``~=V`` becomes the two bounds it stands for) and
    keeps the rest. It is proposed only when the new range is one non-empty interval (the rule linter
    finds no empty or inverted range) that agrees with every release read; otherwise a person writes it.
    """
    if rule_check.result is not WitnessResult.WRONG or rule.witness is None:
        return None
    witness = rule.witness
    file = rule.origin.rpartition(":")[0] or rule.origin
    fact = witness.version_fact
    wrong = [c for c in rule_check.checks if c.agrees is False]
    check = next((c for c in wrong if c.version == version), wrong[0] if wrong else None)
    evidence = _evidence(check, witness.dist)
    measured = "; ".join(m.text for m in rule_check.measured) or rule_check.why
    current = _condition_text(rule, fact)
    moved = _moved_range(rule, rule_check, fact)
    if check is None or isinstance(moved, str):
        why = moved if isinstance(moved, str) else "no release read disagrees"
        return ProposedPatch(rule.id, file, f"{fact} {current or '(any)'}: {measured} (needs a hand edit: {why})",
                             evidence)
    proposed, flip = moved
    summary = (f"{fact} {current or '(any)'} -> {proposed}: {witness.dist} {flip.after} reads {flip.after_status} "
               f"({'turns to' if flip.enters else 'turns away from'} what the rule expects inside, "
               f"{'/'.join(s.value for s in witness.inside)}; {witness.dist} {version} read)")
    diff = _diff(rule, file, rule_file_text, fact, proposed, _new_source(witness.dist, flip, check))
    if not diff:
        return ProposedPatch(rule.id, file, f"{summary} (needs a hand edit: the condition's line was not found "
                                            f"in {file})", evidence)
    return ProposedPatch(rule.id, file, summary, evidence, diff)


class _NotOneInterval(ValueError):
    """The condition is not one version interval a patch can move (a wildcard, two lower bounds)."""


@dataclass(frozen=True, slots=True)
class _Interval:
    """A condition's specifiers as a lower bound, an upper bound and the rest (``!=`` exclusions)."""

    lower: Specifier | None
    upper: Specifier | None
    rest: tuple[Specifier, ...] = ()

    def text(self) -> str:
        return ",".join(str(s) for s in (self.lower, self.upper, *self.rest) if s is not None)


def _interval(spec: SpecifierSet) -> _Interval:
    """``spec`` as bounds: ``>=``/``>`` lower, ``<``/``<=`` upper, ``==V`` both ``>=V``/``<=V``, ``~=V`` both.

    Raises:
        _NotOneInterval: a wildcard ``==``, ``===``, or more than one lower or upper bound.
    """
    lowers: list[Specifier] = []
    uppers: list[Specifier] = []
    rest: list[Specifier] = []
    for s in spec:
        if s.operator in (">=", ">"):
            lowers.append(s)
        elif s.operator in ("<", "<="):
            uppers.append(s)
        elif s.operator == "==" and not s.version.endswith(".*"):
            lowers.append(Specifier(f">={s.version}"))
            uppers.append(Specifier(f"<={s.version}"))
        elif s.operator == "~=":
            release = Version(s.version).release
            lowers.append(Specifier(f">={s.version}"))
            uppers.append(Specifier("<" + ".".join(map(str, (*release[:-2], release[-2] + 1)))))
        elif s.operator == "!=":
            rest.append(s)
        else:
            raise _NotOneInterval(f"{s} is not a bound a patch can move")
    if len(lowers) > 1 or len(uppers) > 1:
        raise _NotOneInterval("more than one lower or upper bound")
    return _Interval(lowers[0] if lowers else None, uppers[0] if uppers else None, tuple(rest))


def _moved_range(rule: Rule, rule_check: RuleCheck, fact: str) -> tuple[str, MeasuredBound] | str:
    """The rule's condition on ``fact`` with the bounds the readings measured, and the change that moved
    most; or why no bound can be moved (the words of a hand edit)."""
    witness = rule.witness
    assert witness is not None
    conditions = [c for c in rule.conditions if c.fact == fact]
    if len(conditions) > 1 or any(c.op != "spec" for c in conditions):
        return f"the condition on {fact} is not one version range"
    flips = [m for m in rule_check.measured if m.after is not None and m.enters is not None]
    if not flips:
        return "the readings show no release where the reading changes; more than a bound moves"
    enters = {m.after for m in flips if m.enters}
    leaves = {m.after for m in flips if not m.enters}
    if len(enters) > 1 or len(leaves) > 1:
        return "the reading changes more than once (a refusal that comes back): more than a bound moves"
    try:
        interval = _interval(conditions[0].operand) if conditions else _Interval(None, None)
    except _NotOneInterval as exc:
        return str(exc)
    lower = Specifier(f">={next(iter(enters))}") if enters else interval.lower
    upper = Specifier(f"<{next(iter(leaves))}") if leaves else interval.upper
    proposed = _Interval(lower, upper, interval.rest)
    text = proposed.text()
    if not text or SpecifierSet(text) == SpecifierSet(interval.text()):
        return "the measured bounds are the rule's own; more than a bound moves"
    problem = _lint_problem(rule, fact, text)
    if problem:
        return f"moving the bounds gives {fact} {text!r}, which the rule linter refuses ({problem})"
    condition = Condition(fact, "spec", SpecifierSet(text))
    disagree = [c.version for c in rule_check.checks
                if c.agrees is not None and reads_inside(witness, c.reading) != condition.holds(c.version)]
    if disagree:
        return (f"{fact} {text!r} would still disagree with the reading of {witness.dist} "
                f"{', '.join(dict.fromkeys(disagree))}; more than a bound moves")
    # The change worth citing is the one that moved a bound (the other may be the rule's own).
    moved = [m for m in flips if (interval.lower if m.enters else interval.upper) != (lower if m.enters else upper)]
    return text, (moved or flips)[0]


def _lint_problem(rule: Rule, fact: str, text: str) -> str:
    """What the rule linter finds wrong with ``rule`` once its condition on ``fact`` is ``text`` ("": nothing)."""
    condition = Condition(fact, "spec", SpecifierSet(text))
    patched = replace(rule, conditions=tuple(condition if c.fact == fact else c for c in rule.conditions))
    return "; ".join(problem.text for problem in lint_rules([patched]))


def _condition_text(rule: Rule, fact: str) -> str:
    """The rule's condition on ``fact`` as written in a file (lower bounds first)."""
    specs = [c.operand for c in rule.conditions if c.fact == fact and isinstance(c.operand, SpecifierSet)]
    parts = [s for spec in specs for s in sorted(spec, key=lambda s: s.operator[0] != ">")]
    return ",".join(str(s) for s in parts)


def _evidence(check: BoundCheck | None, dist: str) -> tuple[str, ...]:
    if check is None:
        return ()
    reading = check.reading
    return (f"{dist} {check.version} ({check.role}, {', '.join(check.targets)}): {reading.status.value}: "
            f"{reading.summary}", *(f"  {site_text(site)}" for site in reading.sites))


def _new_source(dist: str, flip: MeasuredBound, check: BoundCheck) -> str:
    """The reading that moved the bound, as a source line of the rule."""
    site = next(iter(check.reading.sites), None) if check.version == flip.after else None
    where = f": {site.path}:{site.line}" if site is not None and site.line else ""
    role = "first release inside" if flip.enters else "first release outside"
    return (f'- {{ref: "PyPI {dist}=={flip.after} wheel{where} ({role}; {flip.before} reads {flip.before_status}; '
            f'read by stackforge watch)", url: "{PYPI_PROJECT}/{dist}/{flip.after}/", confidence: verified}}')


def _diff(rule: Rule, file: str, text: str, fact: str, proposed: str, source: str) -> str:
    """A unified diff that rewrites the rule's condition on ``fact`` and adds the reading as a source."""
    lines = text.splitlines(keepends=True)
    start = int(rule.origin.rpartition(":")[2] or 1) - 1
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^\s*- id:", lines[i])), len(lines))
    new = list(lines)
    condition = next((i for i in range(start, end) if re.match(rf"^\s+{re.escape(fact)}:\s*\S", lines[i])), None)
    if condition is None:
        return ""
    indent = re.match(r"^(\s*)", lines[condition]).group(1)
    new[condition] = f'{indent}{fact}: "{proposed}"\n'
    last_source = max((i for i in range(start, end) if re.match(r"^\s+- \{ref:", lines[i])), default=None)
    if last_source is not None:
        source_indent = re.match(r"^(\s*)", lines[last_source]).group(1)
        new.insert(last_source + 1, f"{source_indent}{source}\n")
    return "".join(difflib.unified_diff(lines, new, fromfile=f"a/{file}", tofile=f"b/{file}"))
