"""The compatibility matrix written in a format: ``json`` (the versioned document), ``csv`` (one row per
cell), ``md`` (for a pull request, within a comment's size budget), ``text`` (one screen); ``html`` is
written by :mod:`stackforge.report.compat_matrix_html`. The model these write,
:class:`~stackforge.report.compat_matrix.MatrixReport`, is built once by
:func:`~stackforge.report.compat_matrix.build_matrix`; nothing here decides a cell.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import Any

from stackforge.core.envelope import report_json_text
from stackforge.core.records import ResultRecord, Status
from stackforge.plan.rules import Finding
from stackforge.report.compat_matrix import (
    COMPAT_MATRIX_SCHEMA,
    COMPAT_MATRIX_SCHEMA_VERSION,
    CONTRADICTED_GLYPH,
    GLYPHS,
    LEGEND,
    CellSource,
    CellStatus,
    MatrixReport,
    ReportCell,
    ReportRow,
    cell_label,
    header_summary,
    image_display,
    image_reference,
    one_line,
    source_text,
    target_text,
)
from stackforge.core.markdown import md_text

__all__ = ["CSV_COLUMNS", "MD_BUDGET", "report_to_json", "write_matrix_csv", "write_matrix_json", "write_matrix_md",
           "write_matrix_text"]


# ---------------------------------------------------------------------------------------------- json


def report_to_json(report: MatrixReport) -> dict[str, Any]:
    """The versioned JSON envelope (``stackforge.matrix`` v1)."""
    return {"schema": COMPAT_MATRIX_SCHEMA, "schema_version": COMPAT_MATRIX_SCHEMA_VERSION,
            "matrix": {"name": report.matrix_name, "source": report.matrix_source},
            "target": report.target_info | {"name": report.target}, "runs": list(report.runs),
            "predictions_only": report.predictions_only,
            "features": list(report.features), "legend": dict(LEGEND),
            "rows": [_row_json(row) for row in report.rows]}


def _row_json(row: ReportRow) -> dict[str, Any]:
    return {"stack_id": row.stack_id, "stack": row.stack, "plan_status": row.plan_status,
            "pruned_by": [_finding_json(f) for f in row.pruned_by], "derived": row.derived,
            "images": list(row.images()), "cells": [_cell_json(cell) for cell in row.cells]}


def _finding_json(finding: Finding) -> dict[str, Any]:
    """A pruning finding as the matrix JSON has always carried it (the plan's own form adds
    component, confidence and origin)."""
    rule = finding.rule
    return {"rule": rule.id, "effect": rule.effect.value, "feature": rule.feature, "reason": rule.reason,
            "error": rule.error, "remedy": rule.remedy, "sources": [s.to_json() for s in rule.sources],
            "requires": dict(rule.requires)}


def _cell_json(cell: ReportCell) -> dict[str, Any]:
    return {"feature": cell.feature, "status": cell.status.value, "source": cell.source.value,
            "tier": cell.tier.value if cell.tier else None, "reason": cell.reason, "evidence": cell.evidence,
            "metric": None if cell.metric is None else {"name": cell.metric.name, "value": cell.metric.value,
                                                        "unit": cell.metric.unit, "probe": cell.metric.probe},
            "contradicted": cell.contradicted, "unpredicted": cell.unpredicted, "undecided": cell.undecided,
            "prediction": cell.prediction.to_json() if cell.prediction else None,
            "measurements": [_measurement_json(r) for r in cell.records]}


def _measurement_json(record: ResultRecord) -> dict[str, Any]:
    reference, pinned = image_reference(record)
    return {"probe": record.probe, "tier": record.tier.value, "kind": record.kind,
            "status": record.outcome.status.value, "reason": record.outcome.reason,
            "evidence": record.outcome.evidence, "metrics": record.outcome.metrics,
            "duration_s": record.outcome.duration_s, "run_id": record.run_id, "created_at": record.created_at,
            "image": reference, "pinned": pinned, "driver": record.provenance.driver,
            "gpus": list(record.provenance.gpus), "versions": dict(record.provenance.versions)}


def write_matrix_json(report: MatrixReport) -> str:
    """The matrix as pretty JSON text."""
    return report_json_text(report_to_json(report))


# ---------------------------------------------------------------------------------------------- csv


CSV_COLUMNS = ("target", "stack_id", "plan_status", "feature", "status", "source", "tier", "metric",
               "metric_value", "metric_unit", "reason", "evidence", "rule", "contradicted", "image", "run_id",
               "undecided")


def write_matrix_csv(report: MatrixReport) -> str:
    """One line per cell (tidy format: easy to pivot in a spreadsheet or pandas)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row, cell in report.cells():
        decisive = cell.decisive
        rule = cell.prediction.rule if cell.prediction else ""
        if cell.pruned_by and not rule:
            rule = cell.pruned_by[0].rule.id
        writer.writerow([report.target, row.stack_id, row.plan_status, cell.feature, cell.status.value,
                         cell.source.value, cell.tier.value if cell.tier else "",
                         cell.metric.name if cell.metric else "", cell.metric.value if cell.metric else "",
                         cell.metric.unit if cell.metric else "", one_line(cell.reason, 2000),
                         one_line(cell.evidence, 2000), rule, cell.contradicted,
                         image_reference(decisive)[0] if decisive else "",
                         decisive.run_id if decisive else "", one_line(cell.undecided, 2000)])
    return out.getvalue()


# ---------------------------------------------------------------------------------------------- markdown


#: GitHub refuses comments over 65,536 characters; stay below with room for a header.
MD_BUDGET = 60_000
# Ever more compact footnotes, tried in order until the comment fits: (notes on passing cells,
# evidence characters, notes on measured cells at all).
# The first level cuts nothing (``None``: full evidence); the file is shortened only past the budget.
_MD_LEVELS = ((True, None, True), (True, 240, True), (False, 240, True), (False, 80, True), (False, 0, False))
_TRIMMED_NOTE = ("*Evidence notes were shortened to fit a PR comment; the HTML and JSON reports carry "
                 "the full evidence of every cell.*")


def write_matrix_md(report: MatrixReport, *, budget: int = MD_BUDGET) -> str:
    """The matrix as GitHub-flavoured markdown for a PR comment: table, legend, findings, footnotes.

    Every cell gets a footnote with its reason and evidence while the text fits ``budget``; a large
    matrix first drops the notes of passing cells, then shortens evidence, then keeps only rule
    notes, and says so (the HTML and JSON reports always carry everything).
    """
    text = ""
    for level, (pass_notes, evidence_chars, measured_notes) in enumerate(_MD_LEVELS):
        text = _write_md(report, pass_notes=pass_notes, evidence_chars=evidence_chars,
                          measured_notes=measured_notes, trimmed=level > 0)
        if len(text) <= budget:
            break
    return text


def _write_md(report: MatrixReport, *, pass_notes: bool, evidence_chars: int | None, measured_notes: bool,
               trimmed: bool) -> str:
    notes = _Footnotes()
    lines = [f"### stackforge matrix · {_md_escape(target_text(report))}", ""]
    if report.matrix_name or report.runs:
        lines.append(_md_escape(_provenance_line(report)))
        lines.append("")
    lines += [header_summary(report), ""]
    lines.append("| stack | " + " | ".join(f"`{f}`" for f in report.features) + " |")
    lines.append("|---|" + "---|" * len(report.features))
    for row in report.rows:
        lines.append(_md_row(row, notes, evidence_chars, pass_notes=pass_notes,
                             measured_notes=measured_notes))
    lines += ["", _md_legend(), ""]
    if trimmed:
        lines += [_TRIMMED_NOTE, ""]
    lines += _md_contradictions(report)
    lines += notes.render()
    return "\n".join(lines).rstrip() + "\n"


def _provenance_line(report: MatrixReport) -> str:
    parts = []
    if report.matrix_name:
        parts.append(f"matrix {report.matrix_name} ({report.matrix_source})")
    if report.runs:
        shown = ", ".join(report.runs[-3:])
        parts.append(f"runs: {shown}" + (f" (+{len(report.runs) - 3} older)" if len(report.runs) > 3 else ""))
    return " · ".join(parts)


def _md_row(row: ReportRow, notes: _Footnotes, evidence_chars: int | None, *, pass_notes: bool,
            measured_notes: bool) -> str:
    stack = f"`{row.stack_id}`"
    if row.plan_status == "pruned":
        rules = ", ".join(f"`{f.rule.id}`" for f in row.pruned_by) or "the plan"
        stack = f"~~`{row.stack_id}`~~ ⛔ pruned by {rules}" + notes.ref(_pruned_note(row))
    elif row.plan_status == "unplanned":
        stack += (f" (external image `{_md_code(str(row.stack.get('image')), None)}`)" if row.stack.get("external")
                  else " (not in plan)")
    cells = []
    for cell in row.cells:
        if cell.status is CellStatus.PRUNED:
            cells.append("—")     # the stack cell says why; repeating ⛔ in every column is noise
            continue
        wanted = cell.source is not CellSource.MEASURED or measured_notes and (
            pass_notes or cell.status is not CellStatus.PASS or bool(cell.contradicted))
        note = _cell_note(row, cell, evidence_chars) if wanted else ""
        cells.append(_md_escape(cell_label(cell)) + (notes.ref(note) if note else ""))
    return f"| {stack} | " + " | ".join(cells) + " |"


def _cell_note(row: ReportRow, cell: ReportCell, evidence_chars: int | None) -> str:
    """Footnote text of a cell; cells predicted by the same rule share one note."""
    if cell.source is CellSource.NONE and cell.status is not CellStatus.UNDECIDED:
        return ""
    if cell.source is CellSource.PREDICTED and cell.prediction is not None:
        prediction = cell.prediction
        note = _rule_note(prediction.rule, prediction.verdict.value, cell.feature, cell.reason,
                          prediction.error, prediction.remedy, prediction.sources, evidence_chars)
        return note + (_md_escape(f" — {_flat(cell.undecided)}") if cell.undecided else "")
    undecided = next((r for r in cell.records if r.outcome.status is Status.UNDECIDED), None)
    decisive = cell.decisive or (undecided if cell.status is CellStatus.UNDECIDED else None) \
        or (cell.records[0] if cell.records else None)
    text = f"`{row.stack_id}` · `{cell.feature}`: {GLYPHS[cell.status]} {cell.status.value}"
    if decisive is not None:
        text += f" ({decisive.tier.value} probe `{decisive.probe}`)"
    text += f": {_flat(cell.reason)}"
    if cell.evidence and evidence_chars != 0:
        text += f" — evidence: `{_md_code(cell.evidence, evidence_chars)}`"
    if cell.metric is not None:
        text += f" — {cell.metric.name} = {cell.metric.value:g} {cell.metric.unit}".rstrip()
    if cell.contradicted:
        text += f" — {CONTRADICTED_GLYPH} {_flat(cell.contradicted)}"
    elif cell.unpredicted:
        text += " — no rule predicts this failure"
    if decisive is not None:
        shown = image_display(decisive)
        text += f" — run {decisive.run_id}" + (f", image `{shown}`" if shown else "")
    return _md_escape(text)


def _rule_note(rule: str, verdict: str, feature: str, reason: str, error: str, remedy: str,
               sources: Sequence[Mapping[str, str]], evidence_chars: int | None) -> str:
    text = f"rule `{rule}` predicts `{feature}` {verdict}: {_flat(reason)}"
    if error and evidence_chars != 0:
        text += f" — error: `{_md_code(error, evidence_chars)}`"
    if remedy:
        text += f" — remedy: {_flat(remedy)}"
    if sources:
        text += " — sources: " + ", ".join(_md_source(s) for s in sources)
    return _md_escape(text)


def _pruned_note(row: ReportRow) -> str:
    parts = []
    for finding in row.pruned_by:
        part = f"pruned by rule `{finding.rule.id}`: {_flat(finding.rule.reason)}"
        if finding.rule.sources:
            part += " — sources: " + ", ".join(_md_source(s.to_json()) for s in finding.rule.sources)
        parts.append(part)
    return _md_escape(" · ".join(parts) or "pruned by the plan")


def _md_source(source: Mapping[str, str]) -> str:
    """A source as a link where its URL is http(s) (as the HTML report links), else as text; the note it
    goes into is escaped whole."""
    label, url = source_text(source), source.get("url", "")
    return f"[{label}]({url})" if url.startswith(("https://", "http://")) and ")" not in url else label


def _md_legend() -> str:
    statuses = " · ".join(f"{GLYPHS[s]} {s.value}" for s in CellStatus)
    return (f"**Legend** {statuses} · {CONTRADICTED_GLYPH} rule contradicted by measurement · "
            "— a pruned stack. *gate* = decided inside the image without a GPU · "
            "*run* = runtime probe on the GPU · "
            "*bench* = benchmark · *wheel* = measured (wheel): read in the release's code from its wheel on "
            "the index, no image (below gate and run, above a rule) · "
            "*rule* = predicted by a compat rule, not measured. "
            "Footnotes carry each cell's reason and evidence.")


def _md_contradictions(report: MatrixReport) -> list[str]:
    found = [(row, cell) for row, cell in report.cells() if cell.contradicted]
    if not found:
        return []
    lines = [f"**{CONTRADICTED_GLYPH} Rules contradicted by measurement** (review these rules):", ""]
    lines += [f"- `{row.stack_id}` · `{cell.feature}`: {_md_escape(_flat(cell.contradicted))}"
              for row, cell in found]
    return lines + [""]


def _md_escape(text: str) -> str:
    """Table-safe, inert markdown: record and rule text escaped (:func:`~stackforge.core.markdown.md_text`:
    no raw HTML, no ``javascript:`` link), and no pipe or newline breaks a row."""
    return md_text(" ".join(str(text).split())).replace("|", "\\|")


def _md_code(text: str, limit: int | None) -> str:
    """Text inside a code span: one line, no backticks, bounded by ``limit`` (``None``: whole)."""
    flat = str(text).replace("`", "'")
    return _flat(flat) if limit is None else one_line(flat, limit)


def _flat(text: str) -> str:
    """One line, whitespace collapsed, nothing cut (the markdown is a file; the budget levels shorten it)."""
    return " ".join(str(text).split())


class _Footnotes:
    """Numbered footnotes, deduplicated by text (cells predicted by one rule share a note)."""

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}

    def ref(self, text: str) -> str:
        number = self._numbers.setdefault(text, len(self._numbers) + 1)
        return f"[^{number}]"

    def render(self) -> list[str]:
        return [f"[^{number}]: {text}" for text, number in self._numbers.items()]




# ---------------------------------------------------------------------------------------------- text


def write_matrix_text(report: MatrixReport) -> str:
    """One screen: a line per feature with each kept stack's status and where it comes from (the tier that
    measured it, ``rule`` for a prediction); the stacks are numbered above the table. The full cells, their
    evidence and the pruned stacks are in ``--evidence`` (the markdown), ``--format html`` and ``json``."""
    kept = [row for row in report.rows if row.plan_status != "pruned"]
    pruned = len(report.rows) - len(kept)
    lines = [f"matrix {report.matrix_name or ''} on {report.target}: {len(kept)} stack(s) kept"
             + (f", {pruned} pruned by the plan (--evidence lists them)" if pruned else "")]
    lines += [f"  [{number}] {row.stack_id}" + (f" (external image {row.stack.get('image')})"
                                                 if row.stack.get("external") else "")
              for number, row in enumerate(kept, 1)]
    if not kept:
        return "\n".join(lines) + "\n"
    width = max(len(feature) for feature in report.features)
    columns = [f"[{number}]" for number in range(1, len(kept) + 1)]
    cells = {feature: [_short_cell(row.cell(feature)) for row in kept] for feature in report.features}
    column = max(len(text) for values in cells.values() for text in values + columns)
    lines.append(f"  {'feature':<{width}}  " + "  ".join(f"{c:<{column}}" for c in columns).rstrip())
    lines += [f"  {feature:<{width}}  " + "  ".join(f"{v:<{column}}" for v in values).rstrip()
              for feature, values in cells.items()]
    lines.append("  (status (source): the tier that measured it, or rule for a prediction; --evidence: every cell's "
                 "reason and evidence)")
    return "\n".join(lines) + "\n"


def _short_cell(cell: ReportCell) -> str:
    if cell.source is CellSource.MEASURED and cell.tier is not None:
        return f"{cell.status.value} ({cell.tier.value})"
    if cell.source is CellSource.PREDICTED:
        return f"{cell.status.value} (rule)"
    if cell.status is CellStatus.SKIP:
        return "not run"    # a job an interrupted run never reached (a measured skip names its tier above)
    return cell.status.value
