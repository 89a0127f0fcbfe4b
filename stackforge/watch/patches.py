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
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet

from stackforge.plan.rules import Rule
from stackforge.wheels.bisect import site_text
from stackforge.wheels.verify import BoundCheck, RuleCheck, WitnessResult

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
    """The patch for ``rule`` after release ``version`` read against it; ``None`` when the rule still holds."""
    if rule_check.result is not WitnessResult.WRONG or rule.witness is None:
        return None
    file = rule.origin.rpartition(":")[0] or rule.origin
    fact = rule.witness.version_fact
    wrong = [c for c in rule_check.checks if c.agrees is False]
    check = next((c for c in wrong if c.version == version), wrong[0] if wrong else None)
    bound = next((m for m in rule_check.measured if m.after), None)
    evidence = _evidence(check, rule.witness.dist)
    measured = "; ".join(m.text for m in rule_check.measured) or rule_check.why
    current = _condition_text(rule, fact)
    if check is None or bound is None or not check.inside or _has_upper_bound(rule, fact):
        return ProposedPatch(rule.id, file, f"{fact} {current}: {measured} (needs a hand edit: more than a bound "
                                             "moves)", evidence)
    proposed = f"{current},<{bound.after}" if current else f"<{bound.after}"
    summary = (f"{fact} {current or '(any)'} -> {proposed}: {rule.witness.dist} {bound.after} reads "
               f"{bound.after_status} where the rule expects {'/'.join(s.value for s in rule.witness.inside)}")
    diff = _diff(rule, file, rule_file_text, fact, proposed, _new_source(rule.witness.dist, bound.after, check))
    return ProposedPatch(rule.id, file, summary, evidence, diff)


def _condition_text(rule: Rule, fact: str) -> str:
    """The rule's condition on ``fact`` as written in a file (lower bounds first)."""
    specs = [c.operand for c in rule.conditions if c.fact == fact and isinstance(c.operand, SpecifierSet)]
    parts = [s for spec in specs for s in sorted(spec, key=lambda s: s.operator[0] != ">")]
    return ",".join(str(s) for s in parts)


def _has_upper_bound(rule: Rule, fact: str) -> bool:
    return any(s.operator in ("<", "<=", "==", "~=") for c in rule.conditions if c.fact == fact
               and isinstance(c.operand, SpecifierSet) for s in c.operand)


def _evidence(check: BoundCheck | None, dist: str) -> tuple[str, ...]:
    if check is None:
        return ()
    reading = check.reading
    return (f"{dist} {check.version} ({check.role}, {', '.join(check.targets)}): {reading.status.value}: "
            f"{reading.summary}", *(f"  {site_text(site)}" for site in reading.sites))


def _new_source(dist: str, version: str, check: BoundCheck | None) -> str:
    site = next(iter(check.reading.sites), None) if check is not None else None
    where = f": {site.path}:{site.line}" if site is not None and site.line else ""
    return (f'- {{ref: "PyPI {dist}=={version} wheel{where} (first release outside; read by stackforge watch)", '
            f'url: "{PYPI_PROJECT}/{dist}/{version}/", confidence: verified}}')


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
