"""Dead ends: every feature that does not work on a target, with reason, evidence, and the way out.

The dead ends, machine-made ("Flashinfer allreduce fusion SM120 -- DEAD END (JIT doesn't support
SM120)" is one). It is computed from the matrix report, cell by
cell, so it can never disagree with the matrix: a feature is dead on a stack when its cell is a
measured ``fail`` / ``crash`` / ``timeout`` or a predicted ``unavailable``. For each dead feature
the list names the first stack in version order where the feature is *measured* to pass, else the
first kept stack where no rule blocks it (*predicted*, flagged as such: nobody ran it yet).

Where wheel-tier records read the feature in a distribution's releases (``stackforge probe --tier
wheel``, also of releases no stack pins), the list names the first release that unblocks it: the
first measured pass after the newest measured failure, with the code on both sides. Without such a
boundary it says that only a rule (or nothing) speaks for the way out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from stackforge.core.envelope import report_json_text
from stackforge.core.errors import SpecError
from stackforge.core.records import ResultRecord, Status
from stackforge.core.textfit import brief
from stackforge.report.compat_matrix import (
    GLYPHS,
    PREDICTIONS_ONLY,
    CellSource,
    CellStatus,
    MatrixReport,
    ReportCell,
    ReportRow,
    image_reference,
    source_text,
    target_text,
)
from stackforge.core.markdown import md_text

__all__ = ["DEADENDS_SCHEMA", "DeadEnd", "DeadEndReport", "DeadStack", "ReleaseBoundary", "Unblock",
           "find_dead_ends", "release_boundaries", "write_deadends"]

DEADENDS_SCHEMA = "stackforge.deadends"
DEADENDS_SCHEMA_VERSION = 1
FORMATS = ("md", "json", "text")
#: The longest line ``--format text`` prints without ``--evidence``.
SCREEN = 200
# Predicted statuses under which a feature may work on a kept stack (no rule blocks it).
_MAYBE_ALIVE = frozenset({CellStatus.HAZARD, CellStatus.REQUIRES, CellStatus.UNTESTED, CellStatus.SKIP,
                          CellStatus.UNDECIDED})


@dataclass(frozen=True, slots=True)
class DeadStack:
    """One stack on which a feature is dead, and why."""

    stack_id: str
    status: str
    source: str                    # measured | predicted
    tier: str | None
    reason: str
    evidence: str
    rule: str = ""
    sources: tuple[dict[str, str], ...] = ()
    probe: str = ""
    image: str = ""
    run_id: str = ""
    undecided: str = ""            # "undecided by <probe>: <why>" when a probe ran without deciding


@dataclass(frozen=True, slots=True)
class Unblock:
    """The first stack (version order) where a dead feature works, and on what basis."""

    stack_id: str
    basis: str                     # measured | built (compiled and linked, nothing ran) | admitted | predicted
    tier: str | None
    detail: str


@dataclass(frozen=True, slots=True)
class ReleaseBoundary:
    """Measured in a distribution's releases (wheel tier): the first release that unblocks a feature.

    ``first_unblocked`` is ``None`` when the newest release read still blocks it; ``last_blocked``
    is the newest release read that blocks it.
    """

    dist: str
    last_blocked: str
    first_unblocked: str | None
    blocked_evidence: str
    unblocked_evidence: str = ""
    context: str = ""          # the stack-side context the readings depended on (``cuda=12.8``), or ""


@dataclass(frozen=True, slots=True)
class DeadEnd:
    """A feature that is dead on at least one stack of the target."""

    feature: str
    dead_on: tuple[DeadStack, ...]
    stacks_total: int
    unblocked_by: Unblock | None
    boundaries: tuple[ReleaseBoundary, ...] = ()

    @property
    def headline(self) -> DeadStack:
        """The newest stack's dead entry: the one a user on the latest stack would hit."""
        return self.dead_on[-1]


@dataclass(frozen=True, slots=True)
class DeadEndReport:
    """All dead ends of one target, plus the stacks the plan pruned as a whole."""

    target: str
    target_label: str
    dead_ends: tuple[DeadEnd, ...]
    pruned: tuple[tuple[str, tuple[str, ...]], ...]    # (stack_id, ("rule: reason", ...))
    predictions_only: bool = False                      # no probe results: every dead end is predicted

    def features(self) -> tuple[str, ...]:
        return tuple(d.feature for d in self.dead_ends)


def find_dead_ends(report: MatrixReport) -> DeadEndReport:
    """Every dead feature of the matrix, in the matrix's feature order, with its unblocking stack."""
    dead_ends = []
    for feature in report.features:
        # A pruned stack's cells say "pruned", not dead: the stack is listed once, below.
        dead = tuple(_dead_stack(row, row.cell(feature)) for row in report.rows if row.cell(feature).dead)
        judged = sum(row.cell(feature).status is not CellStatus.PRUNED for row in report.rows)
        if dead:
            dead_ends.append(DeadEnd(feature=feature, dead_on=dead, stacks_total=judged,
                                     unblocked_by=_unblock(report.rows, feature),
                                     boundaries=release_boundaries(report.wheel_records, feature)))
    pruned = tuple((row.stack_id, tuple(f"{f.rule.id}: {f.rule.reason}" for f in row.pruned_by))
                   for row in report.rows if row.plan_status == "pruned")
    return DeadEndReport(target=report.target, target_label=target_text(report), dead_ends=tuple(dead_ends),
                         pruned=pruned, predictions_only=report.predictions_only)


def _dead_stack(row: ReportRow, cell: ReportCell) -> DeadStack:
    decisive = cell.decisive
    prediction = cell.prediction
    predicted = cell.source is CellSource.PREDICTED
    return DeadStack(stack_id=row.stack_id, status=cell.status.value, source=cell.source.value,
                     tier=cell.tier.value if cell.tier else None, reason=cell.reason, evidence=cell.evidence,
                     rule=prediction.rule if prediction and predicted else "",
                     sources=tuple(prediction.sources) if prediction and predicted else (),
                     probe=decisive.probe if decisive else "",
                     image=image_reference(decisive)[0] if decisive else "",
                     run_id=decisive.run_id if decisive else "", undecided=cell.undecided)


def _unblock(rows: tuple[ReportRow, ...], feature: str) -> Unblock | None:
    """First measured pass in version order; else the first stack that built it; else the first whose code admits
    it; else the first kept stack no rule blocks."""
    for status, basis in ((CellStatus.PASS, "measured"), (CellStatus.BUILT, "built"),
                          (CellStatus.ADMITTED, "admitted")):
        for row in rows:
            cell = row.cell(feature)
            if cell.source is CellSource.MEASURED and cell.status is status:
                tier = cell.tier.value if cell.tier else None
                return Unblock(row.stack_id, basis, tier, _flat(cell.reason))
    for row in rows:
        cell = row.cell(feature)
        if row.plan_status == "kept" and cell.status in _MAYBE_ALIVE:
            detail = ("no rule blocks it; not measured yet" if cell.status is not CellStatus.HAZARD
                      else f"works with a hazard per rule {cell.prediction.rule if cell.prediction else ''}: "
                           f"{_flat(cell.reason)}")
            if cell.undecided:
                detail += f" ({_flat(cell.undecided)})"
            return Unblock(row.stack_id, "predicted", None, detail)
    return None


def release_boundaries(records: tuple[ResultRecord, ...], feature: str) -> tuple[ReleaseBoundary, ...]:
    """Per distribution (and stack-side context), the first release measured to pass after the newest
    release measured to fail ``feature``; distributions never measured to fail it are left out."""
    series: dict[tuple[str, str], list[tuple[Version, str, ResultRecord]]] = {}
    for record in records:
        if record.feature != feature or record.outcome.status not in (Status.PASS, Status.FAIL) \
                or len(record.provenance.versions) != 1:
            continue
        (dist, version), = record.provenance.versions.items()
        try:
            parsed = Version(version)
        except InvalidVersion:
            continue
        context = ", ".join(f"{name}={record.stack.get(name)}" for name in record.stack.get("depends_on", ())
                            if name not in ("arch", "gpu_count", "interconnect", "multicast"))
        series.setdefault((dist, context), []).append((parsed, version, record))
    found = []
    for (dist, context), points in sorted(series.items()):
        points.sort(key=lambda point: point[0])
        failing = [i for i, (_, _, r) in enumerate(points) if r.outcome.status is Status.FAIL]
        if not failing:
            continue
        last = points[failing[-1]]
        after = points[failing[-1] + 1] if failing[-1] + 1 < len(points) else None
        found.append(ReleaseBoundary(dist=dist, last_blocked=last[1], first_unblocked=after[1] if after else None,
                                     blocked_evidence=_first_line(last[2]),
                                     unblocked_evidence=_first_line(after[2]) if after else "", context=context))
    return tuple(found)


def _first_line(record: ResultRecord) -> str:
    """What a wheel reading found, in one line (its reason: the reader's summary, with the code line)."""
    return record.outcome.reason or next(iter(record.outcome.evidence.splitlines()), "")


# ---------------------------------------------------------------------------------------------- rendering


def write_deadends(report: DeadEndReport, fmt: str, *, evidence: bool = False) -> str:
    """Render as ``md`` (a todo list, evidence folded), ``text`` (one screen; ``evidence``: everything) or ``json``.

    Raises:
        SpecError: an unknown format.
    """
    if fmt == "md":
        return _md(report)
    if fmt == "text":
        return _md(report, fold=False) if evidence else _text(report)
    if fmt == "json":
        return report_json_text(_json(report))
    raise SpecError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def _how(entry: DeadStack) -> str:
    if entry.source == "measured" and entry.tier == "wheel":
        return f"measured (wheel) {entry.status}: read in the release's code, probe {entry.probe}"
    if entry.source == "measured":
        return f"measured {entry.status}, {entry.tier} probe {entry.probe}".rstrip()
    return f"predicted by rule {entry.rule}"


def _unblock_text(unblock: Unblock | None) -> str:
    if unblock is None:
        return "no stack in this matrix unblocks it"
    if unblock.basis == "measured":
        how = "measured (wheel) pass" if unblock.tier == "wheel" else f"measured pass, {unblock.tier}"
    elif unblock.basis == "built":
        how = f"built for the target ({unblock.tier}), not run on a GPU"
    elif unblock.basis == "admitted":
        how = f"admitted by the code ({unblock.tier}), not measured working"
    else:
        how = "predicted, not measured"
    return f"first unblocked by {unblock.stack_id} ({how}: {unblock.detail})"


def _boundary_text(dead: DeadEnd, target: str) -> list[str]:
    """The release boundaries, or a line saying when only a rule speaks for the way out."""
    if not dead.boundaries:
        if dead.unblocked_by is None or dead.unblocked_by.basis in ("measured", "built", "admitted"):
            return []
        from stackforge.wheels.readers import READERS
        from stackforge.wheels.tier import specs_deciding

        # Only a feature a wheel reader decides can be bisected; the rest need a probe in an image.
        measure = (f"`stackforge bisect {dead.feature} --target {target}` measures it"
                   if specs_deciding(READERS, dead.feature)
                   else "no wheel reader reads it: `stackforge probe` in an image measures it")
        return [f"the way out above rests on the rules only: no release is measured to unblock it ({measure})"]
    lines = []
    for boundary in dead.boundaries:
        where = f" [{boundary.context}]" if boundary.context else ""
        if boundary.first_unblocked is None:
            lines.append(f"still blocked in the newest {boundary.dist} release read, {boundary.last_blocked}"
                         f"{where} (measured (wheel): {_flat(boundary.blocked_evidence)})")
        else:
            # A wheel reading shows the code stops refusing the target; that it works is for a runtime probe.
            lines.append(f"first release whose code admits it: {boundary.dist} {boundary.first_unblocked}{where} "
                         f"(measured (wheel): {_flat(boundary.unblocked_evidence)}; {boundary.last_blocked} "
                         f"blocks: {_flat(boundary.blocked_evidence)})")
    return lines


def _md(report: DeadEndReport, *, fold: bool = True) -> str:
    """The todo list; ``fold``: each dead end's evidence (reasons, code lines, sources) under ``<details>``,
    for a pull request; unfolded for ``--evidence`` in a terminal."""
    lines = [f"### Dead ends on {md_text(report.target_label)}", ""]
    if report.predictions_only:
        lines += [f"*{PREDICTIONS_ONLY}: every dead end below is a rule's prediction, not yet measured.*", ""]
    if not report.dead_ends:
        lines.append("No dead ends: every feature is measured or predicted to work on every kept stack.")
    for dead in report.dead_ends:
        head = dead.headline
        # A todo list: the box is ticked only once a stack is measured to pass (the way out is proven).
        box = "x" if dead.unblocked_by is not None and dead.unblocked_by.basis == "measured" else " "
        reason = brief(head.reason) if fold else _flat(head.reason)
        lines.append(f"- [{box}] **{dead.feature}** — DEAD END on {len(dead.dead_on)} of {dead.stacks_total} "
                     f"stacks ({md_text(reason)})")
        details = [_entry_md(entry) for entry in dead.dead_on]
        ways = [_unblock_text(dead.unblocked_by), *_boundary_text(dead, report.target)]
        if fold:
            lines += [f"  - {GLYPHS[CellStatus(e.status)]} `{e.stack_id}`: {md_text(_how(e))}"
                      for e in dead.dead_on]
            lines += [f"  - ➜ {md_text(brief(way, 160))}" for way in ways]
            lines += ["", "  <details><summary>evidence</summary>", "", *(f"  {line}" for line in details),
                      *(f"  - ➜ {md_text(way)}" for way in ways), "", "  </details>", ""]
        else:
            lines += [*details, *(f"  - ➜ {md_text(way)}" for way in ways)]
    if report.pruned:
        lines += ["", "Stacks pruned by the plan (cannot be built or run as a whole):"]
        lines += [f"- ⛔ `{stack}`: {md_text('; '.join(_flat(r) for r in reasons))}"
                  for stack, reasons in report.pruned]
    return "\n".join(lines) + "\n"


def _entry_md(entry: DeadStack) -> str:
    """One dead stack in full: how it was decided, why, the evidence, the sources."""
    glyph = GLYPHS[CellStatus(entry.status)]
    text = f"{_how(entry)} — {_flat(entry.reason)}"
    if entry.evidence:
        text += f" — evidence: `{_flat(entry.evidence.replace('`', chr(39)))}`"
    if entry.sources:
        text += " — sources: " + ", ".join(source_text(s) for s in entry.sources)
    if entry.undecided:
        text += f" — {GLYPHS[CellStatus.UNDECIDED]} {_flat(entry.undecided)}"
    return f"  - {glyph} `{entry.stack_id}`: {md_text(text)}"


def _flat(text: str) -> str:
    """One line, whitespace collapsed, never cut: the list is read from files as much as from terminals."""
    return " ".join(str(text).split())


def _text(report: DeadEndReport) -> str:
    """One screen: a line per dead feature (where, on what evidence, why in brief, the probe or rule) and a
    line for its way out; ``--evidence`` prints everything (:func:`_md` unfolded)."""
    lines = [f"Dead ends on {report.target_label}: {len(report.dead_ends)} feature(s) dead on at least one stack"]
    if report.predictions_only:
        lines.append(f"  ({PREDICTIONS_ONLY}: every dead end below is a rule's prediction)")
    width = max((len(d.feature) for d in report.dead_ends), default=0)
    for dead in report.dead_ends:
        head = dead.headline
        prefix = f"  {dead.feature:<{width}}  {len(dead.dead_on)}/{dead.stacks_total} stacks  {_level(head)}: "
        # brief adds up to 18 characters (" … (+NNNN chars)") to what it keeps.
        lines.append(prefix + brief(head.reason, min(100, SCREEN - len(prefix) - 18)))
        ways = [_unblock_text(dead.unblocked_by), *_boundary_text(dead, report.target)]
        lines.append(f"  {'':<{width}}  way out: {brief('; '.join(_way_brief(w) for w in ways), 150)}")
    if report.pruned:
        lines.append(f"  {len(report.pruned)} stack(s) pruned by the plan as a whole (--evidence lists them and why)")
    lines.append("  (--evidence: every stack's reason, code lines and sources; --format md / json: the same, "
                 "for a pull request / a program)")
    return "\n".join(lines) + "\n"


def _level(entry: DeadStack) -> str:
    """``measured (wheel) wheel.sglang.custom-allreduce`` / ``predicted rule no-nvcc-no-codegen``."""
    if entry.source == "measured":
        return f"measured ({entry.tier}) {entry.probe}".rstrip()
    return f"predicted rule {entry.rule}"


def _way_brief(text: str) -> str:
    """A way-out line without its parenthesised evidence (the full line is for --evidence)."""
    return text.split(" (", 1)[0]


def _json(report: DeadEndReport) -> dict[str, Any]:
    return {"schema": DEADENDS_SCHEMA, "schema_version": DEADENDS_SCHEMA_VERSION, "target": report.target,
            "predictions_only": report.predictions_only,
            "dead_ends": [{"feature": d.feature, "stacks_total": d.stacks_total,
                           "dead_on": [_entry_json(e) for e in d.dead_on],
                           "unblocked_by": None if d.unblocked_by is None else {
                               "stack_id": d.unblocked_by.stack_id, "basis": d.unblocked_by.basis,
                               "tier": d.unblocked_by.tier, "detail": d.unblocked_by.detail},
                           "release_boundaries": [_boundary_json(b) for b in d.boundaries]}
                          for d in report.dead_ends],
            "pruned": [{"stack_id": s, "reasons": list(r)} for s, r in report.pruned]}


def _boundary_json(boundary: ReleaseBoundary) -> dict[str, Any]:
    return {"dist": boundary.dist, "last_blocked": boundary.last_blocked,
            "first_unblocked": boundary.first_unblocked, "blocked_evidence": boundary.blocked_evidence,
            "unblocked_evidence": boundary.unblocked_evidence, "context": boundary.context}


def _entry_json(entry: DeadStack) -> dict[str, Any]:
    return {"stack_id": entry.stack_id, "status": entry.status, "source": entry.source, "tier": entry.tier,
            "reason": entry.reason, "evidence": entry.evidence, "rule": entry.rule,
            "sources": [dict(s) for s in entry.sources], "probe": entry.probe, "image": entry.image,
            "run_id": entry.run_id, "undecided": entry.undecided}
