"""The compatibility matrix: stacks x features for one target, every cell with its evidence.

Inputs are measured :class:`~stackforge.core.records.ResultRecord` s and the plan (``stackforge plan
--json``: rules' predictions, pruned stacks, derived facts). Everything here is pure: data in,
:class:`MatrixReport` out, built once per command and handed to every view (dead ends, pick, upgrade,
diff). It is written in a format by :mod:`stackforge.report.compat_matrix_write` (``text``, ``md``,
``json``, ``csv``) and :mod:`stackforge.report.compat_matrix_html`.

How a cell is decided (documented here because every other view -- dead ends, pick, diff -- uses
the same function, :func:`decide_cell`):

1. Records of the cell (same stack, target and feature; several probes may speak for one feature)
   that ``skip`` say nothing about the feature and are set aside; so are ``undecided`` ones (the
   probe ran but could not reach the deciding code path out of its real context): they are kept,
   with their evidence, but decide nothing.
2. Of the rest, the strongest evidence level decides: records taken on the GPU (``runtime`` and
   ``bench`` tiers) outrank ``gate`` records (decided inside the image without a GPU), which
   outrank ``wheel`` records (the release's code read from its wheel on the index, no image: a
   wheel record speaks for every stack that pins that release, see :mod:`stackforge.wheels.match`).
   A cell a wheel record decides is *measured (wheel)*: below gate and runtime, above a rule.
3. Within that level the worst outcome wins: ``crash`` > ``timeout`` > ``fail`` > ``pass`` >
   ``error``. A probe that broke (``error``) does not hide a pass, but any real failure does.
   What a tier can conclude comes from the feature catalog (``compat/knowledge.yaml``, through a
   :class:`CellJudge`): a pass of a tier that only shows the code *admits* the target (a code reading, a
   gate that runs nothing) makes the cell ``admitted``, never ``pass``; a pass of a tier that *builds* it and
   whose record says it compiled and linked the module the target uses is ``built`` (stronger than
   ``admitted``, weaker than a GPU ``pass``); a benchmark's record never decides
   a feature of the catalog (its numbers are metrics, kept in the cell); and a feature the target's
   hardware cannot have is ``n/a`` with the reason, whatever its records say. A feature whose serving code
   JIT-builds a FlashInfer module (``jit: flashinfer``) is ``fail`` on a stack whose image a gate probe
   measured unable to JIT (no nvcc, nothing prebuilt), unless a GPU run decided it: what the code admits
   cannot be built there.
4. A measurement always wins over a prediction. When they disagree -- a measured pass where a
   rule predicted the feature unavailable -- the cell keeps both and is flagged "rule contradicted
   by measurement" (the rule needs fixing). A measured failure no rule predicted is marked
   "unpredicted" (a rule is missing). One exception: a wheel-tier pass (the code admits the target)
   is set aside under a rule whose data says no wheel reading can decide it (``unwitnessed``: a
   failure only running the kernel shows); the rule's prediction shows and says so.
5. Without an informative measurement the rule's prediction shows (``unavailable``, ``hazard``,
   ``requires``), a pruned stack shows ``pruned``, a cell whose probes were all undecided shows
   ``undecided``, and anything else is ``untested``. Every such cell whose records include an
   undecided one says so: "undecided by <probe>: <why>" (:attr:`ReportCell.undecided`).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from packaging.version import InvalidVersion, Version

from stackforge.bench.catalog import catalog as bench_catalog
from stackforge.core.data import display_path
from stackforge.core.errors import SpecError
from stackforge.core.model import Target
from stackforge.core.records import (
    NOT_RUN_RUNNER,
    TIER_PREFERENCE,
    Prediction,
    ResultRecord,
    Status,
    Tier,
    Verdict,
    decisive_record,
    says_built,
    says_cannot_jit,
    undecided_text,
)
from stackforge.plan.derive import DriverFloor, cell_driver_floor
from stackforge.plan.features import FeatureCatalog, FeatureSpec, load_feature_catalog
from stackforge.plan.planner import Plan, PlanCell
from stackforge.plan.rules import Finding

__all__ = [
    "DEAD_STATUSES",
    "GLYPHS",
    "LEGEND",
    "COMPAT_MATRIX_SCHEMA",
    "COMPAT_MATRIX_SCHEMA_VERSION",
    "PREDICTIONS_ONLY",
    "ReportCell",
    "CellStatus",
    "MatrixReport",
    "Metric",
    "ReportRow",
    "CellSource",
    "CellJudge",
    "cell_judges",
    "build_matrix",
    "check_features",
    "choose_target",
    "decide_cell",
    "headline_value",
    "image_display",
    "image_reference",
    "key_metric",
    "metric_center",
    "row_driver_floor",
    "stack_order_key",
]

COMPAT_MATRIX_SCHEMA = "stackforge.matrix"
COMPAT_MATRIX_SCHEMA_VERSION = 1
FORMATS = ("text", "md", "html", "json", "csv")


class CellSource(str, Enum):
    """Where a cell's status comes from."""

    MEASURED = "measured"    # a probe or benchmark ran and decided it
    PREDICTED = "predicted"  # a compat rule says so; nothing measured it
    TARGET = "target"        # the target's hardware cannot have the feature (compat/knowledge.yaml needs)
    NONE = "none"            # nobody knows yet


class CellStatus(str, Enum):
    """Everything a cell can say. The first six are measured statuses (same values as Status);
    ``undecided`` (also a Status value) is a probe that ran without deciding, never a measurement."""

    PASS = "pass"
    # a tier that can only show the code admits the target passed it (a code reading, a gate that runs
    # nothing): whether the feature works needs a tier that decides it (compat/knowledge.yaml tiers)
    ADMITTED = "admitted"
    # a tier that builds the feature's module compiled and linked it for the target (no GPU loaded or ran it)
    BUILT = "built"
    FAIL = "fail"
    CRASH = "crash"
    TIMEOUT = "timeout"
    ERROR = "error"
    SKIP = "skip"
    UNDECIDED = "undecided"       # probes ran but none could decide; no rule predicts the feature
    UNAVAILABLE = "unavailable"   # predicted by a rule
    HAZARD = "hazard"             # predicted by a rule: works, with a known risk
    REQUIRES = "requires"         # predicted by a rule: works given a requirement (driver, env)
    PRUNED = "pruned"             # the whole stack is incompatible (plan)
    UNTESTED = "untested"         # neither measured nor predicted
    NOT_APPLICABLE = "n/a"        # the target's hardware cannot have the feature (no NVLink, one GPU...)


#: Statuses that make a feature a dead end when measured.
DEAD_STATUSES = frozenset({CellStatus.FAIL, CellStatus.CRASH, CellStatus.TIMEOUT})

GLYPHS: dict[CellStatus, str] = {
    CellStatus.PASS: "✅", CellStatus.BUILT: "🔨", CellStatus.ADMITTED: "☑️", CellStatus.FAIL: "❌", CellStatus.CRASH: "💥",
    CellStatus.TIMEOUT: "⏳", CellStatus.ERROR: "🐞", CellStatus.SKIP: "⏭️", CellStatus.UNDECIDED: "🤷",
    CellStatus.UNAVAILABLE: "🚫", CellStatus.HAZARD: "⚠️", CellStatus.REQUIRES: "🔧", CellStatus.PRUNED: "⛔",
    CellStatus.UNTESTED: "❔", CellStatus.NOT_APPLICABLE: "∅",
}
CONTRADICTED_GLYPH = "‼️"
#: How every report without a single probe result for its target says so.
PREDICTIONS_ONLY = "predictions only — no probe results"

LEGEND: dict[str, str] = {
    "pass": "measured: works",
    "admitted": ("measured: the code admits the target (a code reading or a gate); whether it works needs a "
                 "runtime probe"),
    "built": ("measured: the module the target uses compiled and linked in the image (no GPU loaded or ran "
              "it); whether it runs needs a runtime probe"),
    "fail": "measured: does not work", "crash": "measured: died by a signal",
    "timeout": "measured: hung and was killed at its time limit",
    "error": "the probe itself broke (no verdict)",
    "skip": "probe not applicable here (e.g. needs a GPU)",
    "undecided": "a probe ran but could not reach the deciding code path out of its real context (no verdict)",
    "unavailable": "predicted by a rule: not available",
    "hazard": "predicted by a rule: works with a known risk",
    "requires": "predicted by a rule: needs a driver/env",
    "pruned": "the stack is incompatible as a whole (plan)", "untested": "neither measured nor predicted",
    "n/a": "the target's hardware cannot have this feature (e.g. no NVLink): counted nowhere",
    "contradicted": "a measurement contradicts a rule's prediction (the rule needs review)",
}
HOW_LABELS = {"gate": "gate", "runtime": "run", "bench": "bench", "wheel": "wheel", "predicted": "rule"}

VERSION_AXES = ("cuda", "torch", "flashinfer", "sglang", "python")
_PREDICTED_STATUS = {Verdict.UNAVAILABLE: CellStatus.UNAVAILABLE, Verdict.HAZARD: CellStatus.HAZARD,
                     Verdict.REQUIRES: CellStatus.REQUIRES}


# ---------------------------------------------------------------------------------------------- report model


@dataclass(frozen=True, slots=True)
class Metric:
    """The one number that summarises a cell (median when the bench repeated itself)."""

    name: str
    value: float
    unit: str = ""
    probe: str = ""

    def text(self) -> str:
        number = f"{self.value:.3g}" if abs(self.value) < 1000 else f"{self.value:,.0f}"
        return f"{number} {self.unit}".strip() if self.unit else f"{self.name} {number}"


@dataclass(frozen=True, slots=True)
class ReportCell:
    """One stack x feature cell.

    Attributes:
        status: what the cell says (see :class:`CellStatus`).
        source: measured, predicted or none.
        tier: the tier of the deciding record when measured.
        reason / evidence: the deciding record's reason and evidence, or the rule's reason and error.
        metric: key metric of the cell's records, if any.
        records: every record of the cell, all tiers, skips included (the full evidence).
        prediction: what the rules predicted (kept even when a measurement decides).
        contradicted: set when a measured pass contradicts a rule predicting ``unavailable``.
        unpredicted: a measured dead end that no rule predicted.
        pruned_by: the pruning findings, for cells of a pruned stack.
        undecided: "undecided by <probe>: <why>" for each undecided record, when none of the records
            decided the cell (empty otherwise).
    """

    feature: str
    status: CellStatus
    source: CellSource
    tier: Tier | None = None
    reason: str = ""
    evidence: str = ""
    metric: Metric | None = None
    records: tuple[ResultRecord, ...] = ()
    prediction: Prediction | None = None
    contradicted: str = ""
    unpredicted: bool = False
    pruned_by: tuple[Finding, ...] = ()
    undecided: str = ""

    @property
    def how(self) -> str:
        """``gate`` / ``runtime`` / ``bench`` / ``wheel`` for measured cells, ``predicted`` or ``""`` otherwise."""
        if self.source is CellSource.MEASURED and self.tier is not None:
            return self.tier.value
        return "predicted" if self.source is CellSource.PREDICTED else ""

    @property
    def dead(self) -> bool:
        """A dead end: measured fail/crash/timeout, or predicted unavailable."""
        return self.status in DEAD_STATUSES or self.status is CellStatus.UNAVAILABLE

    @property
    def decisive(self) -> ResultRecord | None:
        """The record that decided a measured cell."""
        return decisive_record(self.records) if self.source is CellSource.MEASURED else None


@dataclass(frozen=True, slots=True)
class ReportRow:
    """One stack: its plan status and one cell per feature."""

    stack_id: str
    stack: dict[str, Any]
    plan_status: str              # kept | pruned | unplanned (measured, but not in the plan)
    cells: tuple[ReportCell, ...]
    pruned_by: tuple[Finding, ...] = ()
    derived: dict[str, Any] | None = None
    findings: tuple[Finding, ...] = ()
    driver_floor: DriverFloor | None = None    # the plan cell's; None for a stack the plan does not list

    def cell(self, feature: str) -> ReportCell:
        for cell in self.cells:
            if cell.feature == feature:
                return cell
        raise KeyError(feature)

    @property
    def records(self) -> tuple[ResultRecord, ...]:
        return tuple(r for c in self.cells for r in c.records)

    def images(self) -> tuple[str, ...]:
        """Distinct images seen in this row's records (the pinned reference when known)."""
        return tuple(dict.fromkeys(image_display(r) for r in self.records if image_display(r)))


@dataclass(frozen=True, slots=True)
class MatrixReport:
    """The compatibility matrix for one target."""

    target: str
    target_info: dict[str, Any]
    features: tuple[str, ...]
    rows: tuple[ReportRow, ...]
    matrix_name: str = ""
    matrix_source: str = ""
    runs: tuple[str, ...] = ()
    #: no probe result for this target: every cell is a rule's prediction (or untested)
    predictions_only: bool = False
    #: every wheel-tier record of the target, also those of releases no row pins (release boundaries)
    wheel_records: tuple[ResultRecord, ...] = ()

    def row(self, stack_id: str) -> ReportRow:
        for row in self.rows:
            if row.stack_id == stack_id:
                return row
        raise KeyError(stack_id)

    def cells(self) -> Iterable[tuple[ReportRow, ReportCell]]:
        for row in self.rows:
            for cell in row.cells:
                yield row, cell


# ---------------------------------------------------------------------------------------------- building


def choose_target(records: Sequence[ResultRecord], plan: Plan, target: str | None) -> str:
    """The target to report on: the given one, else the only one known.

    Raises:
        SpecError: no target is known, or several are and none was chosen.
    """
    known = sorted({r.target for r in records} | {c.target.name for c in plan.cells}
                   | {t.name for t in plan.targets})
    if target:
        if known and target not in known:
            raise SpecError(f"no results or plan entries for target {target!r}; known: {', '.join(known)}")
        return target
    if len(known) == 1:
        return known[0]
    if not known:
        raise SpecError("no target: the results and the plan are empty")
    raise SpecError(f"several targets in these results; choose one with --target: {', '.join(known)}")


def build_matrix(records: Sequence[ResultRecord], plan: Plan, target: str, *,
                 features: Sequence[str] = (), runs: Sequence[str] = (),
                 catalog: FeatureCatalog | None = None,
                 hosts: Mapping[str, Mapping[str, Any]] | None = None) -> MatrixReport:
    """Build the stacks x features matrix for ``target``.

    Args:
        records: measured results (any targets; only ``target``'s are used).
        plan: the plan (predictions, pruned stacks); :meth:`Plan.empty` for records only.
        target: the target profile name.
        features: restrict and order the feature columns (default: the plan's features in plan
            order, then any measured feature the plan does not know, sorted).
        runs: run ids the records came from, shown in the header.
        catalog: the feature catalog (what each tier concludes, the hardware each feature needs);
            ``compat/knowledge.yaml`` when not given.
        hosts: run id -> that run's ``host.json`` (its host check, :func:`host_check_faults`); a GPU record of a
            run whose host check failed on a GPU it used is undecided, the host's.
    """
    catalog = catalog or load_feature_catalog()
    profile = plan.target(target)
    mine = [r for r in records if r.target == target]
    wheel = tuple(r for r in mine if r.tier is Tier.WHEEL)
    imaged = [r for r in mine if r.tier is not Tier.WHEEL]
    plan_cells = {c.stack_id: c for c in plan.cells_for_target(target)}
    # A wheel reading of a narrower fact (``torch-symm-mem:flag``, ``metadata:...``) is no column.
    present = _features([*imaged, *(r for r in wheel if ":" not in r.feature)], plan_cells.values())
    columns = check_features(features, present) or present
    stacks = _stacks(imaged, plan_cells)
    grouped: dict[tuple[str, str], list[ResultRecord]] = {}
    for record in imaged:
        grouped.setdefault((record.stack_id, record.feature), []).append(record)
    for stack_id, stack in stacks.items():
        _attach_wheel_records(grouped, stack_id, stack, plan_cells.get(stack_id), wheel)
    judges = cell_judges(columns, profile, catalog)
    cannot_jit = cannot_jit_by_stack(imaged)
    checks = host_check_faults(hosts or {})
    rows = tuple(_row(stack_id, stack, plan_cells.get(stack_id), grouped, judges, cannot_jit, checks)
                 for stack_id, stack in sorted(stacks.items(), key=lambda kv: stack_order_key(*kv)))
    return MatrixReport(target=target, target_info=profile.to_json() if profile else {"name": target},
                        features=columns, rows=rows, matrix_name=plan.matrix.name,
                        matrix_source=display_path(plan.matrix.source) if plan.matrix.source else "",
                        runs=tuple(runs), predictions_only=not mine and bool(plan_cells), wheel_records=wheel)


def _attach_wheel_records(grouped: dict[tuple[str, str], list[ResultRecord]], stack_id: str,
                          stack: Mapping[str, Any], plan_cell: PlanCell | None,
                          wheel: Sequence[ResultRecord]) -> None:
    """Add to a stack's cells the wheel records of the releases it pins (same context values).

    A pruned stack gets none: a release's code says nothing about a stack that cannot be installed,
    and a pass there would read as the plan contradicted.
    """
    from stackforge.wheels.match import record_matches, stack_context, stack_pins

    if plan_cell is not None and plan_cell.pruned:
        return
    # An external image (probe --image) has no plan cell: its record's stack carries what it was read to have.
    derived = plan_cell.derived.to_json() if plan_cell else stack.get("derived")
    pins, context = stack_pins(stack, derived), stack_context(stack, derived)
    for record in wheel:
        if record_matches(record, pins, context):
            grouped.setdefault((stack_id, record.feature), []).append(record)


def check_features(wanted: Sequence[str], present: Sequence[str]) -> tuple[str, ...]:
    """``wanted`` when every name is a feature (the rules' vocabulary, a probe's, or one the results measured).

    Raises:
        SpecError: a name no rule and no record knows; a typo would otherwise be a silent empty column.
    """
    from stackforge.probes.catalog import known_features

    known = tuple(dict.fromkeys((*known_features(), *present)))
    unknown = [f for f in wanted if f not in known]
    if unknown:
        raise SpecError(f"unknown feature(s): {', '.join(unknown)}; known: {', '.join(known)}")
    return tuple(wanted)


@dataclass(frozen=True, slots=True)
class CellJudge:
    """What a cell of one feature on one target is judged by besides its records: the feature's spec
    (which tiers decide it, which only admit) and why the target cannot have it (``""``: it can)."""

    spec: FeatureSpec
    not_applicable: str = ""


def cell_judges(features: Sequence[str], profile: Target | None, catalog: FeatureCatalog) -> dict[str, CellJudge]:
    """One :class:`CellJudge` per feature column of a target (``profile`` None: a target no plan describes)."""
    return {f: CellJudge(catalog.spec(f), catalog.spec(f).not_applicable(profile)) for f in features}


def decide_cell(feature: str, records: Sequence[ResultRecord], prediction: Prediction | None = None,
                pruned_by: Sequence[Finding] = (), *, judge: CellJudge | None = None) -> ReportCell:
    """Decide one cell from its records and its prediction (the rules are in the module docstring).

    ``judge`` comes from the feature catalog and the target (:func:`build_matrix` makes one per column);
    without it, a feature the catalog does not describe: every wheel or gate pass only admits.
    """
    judge = judge or CellJudge(FeatureSpec(name=feature, question=""))
    records = tuple(sorted(records, key=lambda r: (r.tier.value, r.probe)))
    if judge.not_applicable:
        return ReportCell(feature=feature, status=CellStatus.NOT_APPLICABLE, source=CellSource.TARGET,
                          reason=judge.not_applicable, records=records, prediction=prediction,
                          pruned_by=tuple(pruned_by))
    blind = _wheel_blind_passes(records, prediction)
    decisive = decisive_record([r for r in records if r not in blind and judge.spec.decided_by(r.tier)])
    if decisive is not None:
        cell = _measured_cell(feature, records, decisive, decisive.outcome.status, prediction, tuple(pruned_by))
        if cell.status is CellStatus.PASS and judge.spec.only_admits(decisive.tier):
            built = judge.spec.builds(decisive.tier) and says_built(decisive)
            cell = replace(cell, status=CellStatus.BUILT if built else CellStatus.ADMITTED,
                           reason=_admitted_reason(judge.spec, decisive, built))
        return cell
    benched = tuple(r for r in records if not judge.spec.decided_by(r.tier))
    cell = _unmeasured_cell(feature, tuple(r for r in records if r not in benched), prediction, tuple(pruned_by))
    if blind and prediction is not None and cell.source is CellSource.PREDICTED:
        admitted = ", ".join(r.probe for r in blind)
        cell = replace(cell, reason=f"{cell.reason} (the release's code admits it, {admitted} passed, but no wheel "
                                    f"reading decides this rule: {prediction.unwitnessed})")
    if benched:
        # Kept with their numbers: what the benchmarks measured is worth seeing, it just decides nothing here.
        note = (f"benchmark(s) {', '.join(dict.fromkeys(r.probe for r in benched))} measured numbers only: "
                f"a benchmark never decides {feature}")
        reason = note if cell.status is CellStatus.UNTESTED else f"{cell.reason} ({note})"
        cell = replace(cell, records=records, metric=key_metric(records), reason=reason)
    return cell


def _admitted_reason(spec: FeatureSpec, decisive: ResultRecord, built: bool = False) -> str:
    """The decisive record's reason, and what it cannot show: ``<reason> (the code admits the target; ...)``."""
    deciding = " or ".join(t.value for t in spec.deciding_tiers()) or Tier.RUNTIME.value
    shown = "built for the target, nothing ran it" if built else "the code admits the target"
    return f"{decisive.outcome.reason} ({shown}; whether {spec.name} works is decided by a {deciding} probe)"


def cannot_jit_by_stack(records: Iterable[ResultRecord]) -> dict[str, ResultRecord]:
    """stack id -> the first gate record that measured the stack's image cannot JIT-compile (no nvcc,
    nothing prebuilt covers the modules)."""
    found: dict[str, ResultRecord] = {}
    for record in records:
        if says_cannot_jit(record):
            found.setdefault(record.stack_id, record)
    return found


def without_jit(cell: ReportCell, spec: FeatureSpec, cannot_jit: ResultRecord | None) -> ReportCell:
    """A feature whose serving code JIT-builds a FlashInfer module, on an image measured unable to JIT: what
    the code admits cannot be built there, so the cell is a gate ``fail`` citing that record. A cell a GPU
    run decided, a dead cell and an ``n/a`` cell stay as they are."""
    if cannot_jit is None or spec.jit != "flashinfer" or cell.status in DEAD_STATUSES:
        return cell
    if cell.status is CellStatus.NOT_APPLICABLE or (cell.tier is not None and cell.tier is not Tier.WHEEL
                                                     and cell.tier is not Tier.GATE):
        return cell
    if cell.source is CellSource.PREDICTED and cell.status is CellStatus.UNAVAILABLE:
        return cell
    reason = (f"this image cannot JIT-compile the FlashInfer module {spec.name} builds at serving time "
              f"({cannot_jit.probe}: {cannot_jit.outcome.reason})")
    if cell.status in (CellStatus.ADMITTED, CellStatus.PASS) and cell.reason:
        reason += f"; what the code admits: {one_line(cell.reason, 200)}"
    judged = replace(cannot_jit, feature=spec.name,
                     outcome=replace(cannot_jit.outcome, status=Status.FAIL, reason=reason))
    records = tuple(r for r in cell.records if r is not cannot_jit) + (judged,)
    return replace(cell, status=CellStatus.FAIL, source=CellSource.MEASURED, tier=Tier.GATE, reason=reason,
                   evidence=cannot_jit.outcome.evidence, records=records, unpredicted=False, contradicted="")


def _wheel_blind_passes(records: Sequence[ResultRecord], prediction: Prediction | None) -> tuple[ResultRecord, ...]:
    """Wheel-tier passes that say nothing against the rule predicting the cell unavailable.

    A wheel pass only says the release's code admits the target; a rule whose data says no wheel
    reading can decide it (``unwitnessed``: a failure only running the kernel shows) stands over it.
    A rule a wheel reader witnesses is still contradicted by a wheel pass (its bound is wrong).
    """
    if prediction is None or prediction.verdict is not Verdict.UNAVAILABLE or not prediction.unwitnessed:
        return ()
    return tuple(r for r in records if r.tier is Tier.WHEEL and r.outcome.status is Status.PASS)


def _measured_cell(feature: str, records: tuple[ResultRecord, ...], decisive: ResultRecord, status: Status,
                   prediction: Prediction | None, pruned_by: tuple[Finding, ...]) -> ReportCell:
    predicted_dead = prediction is not None and prediction.verdict is Verdict.UNAVAILABLE
    contradicted = ""
    if status is Status.PASS and predicted_dead:
        contradicted = (f"rule contradicted by measurement: rule {prediction.rule} predicts {feature} "
                        f"unavailable ({prediction.reason}), but {decisive.tier.value} probe "
                        f"{decisive.probe} passed")
    elif status is Status.PASS and pruned_by:
        contradicted = (f"rule contradicted by measurement: the plan prunes this stack "
                        f"({', '.join(f.rule.id for f in pruned_by)}), but {decisive.tier.value} probe "
                        f"{decisive.probe} passed")
    unpredicted = CellStatus(status.value) in DEAD_STATUSES and not predicted_dead and not pruned_by
    return ReportCell(feature=feature, status=CellStatus(status.value), source=CellSource.MEASURED,
                      tier=decisive.tier, reason=decisive.outcome.reason, evidence=decisive.outcome.evidence,
                      metric=key_metric(records), records=records, prediction=prediction,
                      contradicted=contradicted, unpredicted=unpredicted, pruned_by=pruned_by)


def _unmeasured_cell(feature: str, records: tuple[ResultRecord, ...], prediction: Prediction | None,
                     pruned_by: tuple[Finding, ...]) -> ReportCell:
    skipped = "; ".join(f"{r.probe} skipped: {r.outcome.reason}"
                        for r in records if r.outcome.status is Status.SKIP)
    undecided_records = [r for r in records if r.outcome.status is Status.UNDECIDED]
    undecided = undecided_text(undecided_records)
    if pruned_by:
        first = pruned_by[0]
        return ReportCell(feature=feature, status=CellStatus.PRUNED, source=CellSource.PREDICTED,
                          reason=first.rule.reason, evidence=first.rule.error or skipped, records=records,
                          prediction=prediction, pruned_by=pruned_by, undecided=undecided)
    if prediction is not None and prediction.verdict in _PREDICTED_STATUS:
        return ReportCell(feature=feature, status=_PREDICTED_STATUS[prediction.verdict],
                          source=CellSource.PREDICTED, reason=prediction.reason,
                          evidence=prediction.error or skipped, records=records, prediction=prediction,
                          undecided=undecided)
    if undecided_records:   # probes ran, none decided, no rule speaks: nobody knows, and it says why
        return ReportCell(feature=feature, status=CellStatus.UNDECIDED, source=CellSource.NONE,
                          reason=undecided, evidence=undecided_records[0].outcome.evidence, records=records,
                          prediction=prediction, undecided=undecided)
    if records and all(r.provenance.runner == NOT_RUN_RUNNER for r in records):
        # Only jobs an interrupted run never reached: nothing measured it, and the cell says so.
        return ReportCell(feature=feature, status=CellStatus.SKIP, source=CellSource.NONE, tier=records[0].tier,
                          reason=records[0].outcome.reason, evidence=records[0].outcome.evidence, records=records,
                          prediction=prediction)
    if records:   # only skips: measured, but not applicable here
        first = records[0]
        return ReportCell(feature=feature, status=CellStatus.SKIP, source=CellSource.MEASURED,
                          tier=first.tier, reason=first.outcome.reason,
                          evidence=first.outcome.evidence or skipped, records=records, prediction=prediction)
    return ReportCell(feature=feature, status=CellStatus.UNTESTED, source=CellSource.NONE,
                      prediction=prediction, reason="no probe result and no rule for this feature yet")


def _features(records: Sequence[ResultRecord], plan_cells: Iterable[PlanCell]) -> tuple[str, ...]:
    ordered: dict[str, None] = {}
    for cell in plan_cells:
        ordered.update((p.feature, None) for p in cell.predictions)
    ordered.update((f, None) for f in sorted({r.feature for r in records} - set(ordered)))
    return tuple(ordered)


def _stacks(records: Sequence[ResultRecord], plan_cells: Mapping[str, PlanCell]) -> dict[str, dict[str, Any]]:
    stacks = {stack_id: cell.stack.to_json() for stack_id, cell in plan_cells.items()}
    for record in records:
        cell = plan_cells.get(record.stack_id)
        if cell is not None and cell.external_id is not None:
            # An external image's cell is the rules' view of it; the row shows what the image was read to have.
            stacks[record.stack_id] = record.stack
        stacks.setdefault(record.stack_id, record.stack)
    return stacks


def _row(stack_id: str, stack: dict[str, Any], plan_cell: PlanCell | None,
         grouped: Mapping[tuple[str, str], Sequence[ResultRecord]], judges: Mapping[str, CellJudge],
         cannot_jit: Mapping[str, ResultRecord], checks: Mapping[str, HostFault]) -> ReportRow:
    predictions = {p.feature: p for p in plan_cell.predictions} if plan_cell else {}
    pruned_by = plan_cell.pruning_findings() if plan_cell else ()
    faults = run_faults(host_faults(grouped.get((stack_id, P2P_FEATURE), ())), checks)
    cannot_jit = None if pruned_by else cannot_jit.get(stack_id)
    cells = tuple(without_jit(decide_cell(f, blame_host(grouped.get((stack_id, f), ()), judge.spec, faults),
                                          predictions.get(f), pruned_by, judge=judge), judge.spec, cannot_jit)
                  for f, judge in judges.items())
    status = plan_cell.status if plan_cell else "unplanned"
    return ReportRow(stack_id=stack_id, stack=stack, plan_status=status, cells=cells, pruned_by=pruned_by,
                     derived=plan_cell.derived.to_json() if plan_cell else stack.get("derived"),
                     findings=plan_cell.findings if plan_cell else (),
                     driver_floor=plan_cell.driver_floor if plan_cell else None)


#: Record statuses that would make a runtime verdict dead.
_BROKEN_RECORD = frozenset({Status.FAIL, Status.TIMEOUT, Status.CRASH})
#: The feature whose failure on a host makes the collectives' failures of that run the host's.
P2P_FEATURE = "p2p-access"
#: A failure whose own words (its reason, never the whole log: NCCL's INFO lines name "via P2P/IPC" in every
#: healthy run) name peer-to-peer or CUDA IPC memory: the failure says itself that it is P2P's.
_P2P_WORDS = re.compile(r"cudaIpc\w*|peer[ -]access|peer[ -]to[ -]peer|\bP2P\b|\bIPC\b", re.IGNORECASE)
#: Metrics in which a record says how many GPUs it used, when it lists no ``devices``: the collective
#: probes' ``gpus`` / ``ranks``, the all-reduce sweep's ``world_size``, the serving bench's ``tp``.
_GPU_COUNT_METRICS = ("gpus", "ranks", "world_size", "tp")


@dataclass(frozen=True, slots=True)
class HostFault:
    """What failed on the host in one run, for the records of that run to be judged against.

    Attributes:
        source: how the blame names it ("p2p-access fails on this host in the same run (<probe>: <reason>)",
            or the run's host check).
        pairs: the GPU pairs (unordered, CUDA indices of the run's jobs) whose P2P failed or was never reached;
            None when unknown which (a P2P probe killed at its timeout, a host check): every pair is suspect.
        p2p: whether the fault is the host's P2P (judged by pairs and a failure's own words) rather than a
            host check failing on every GPU (every broken GPU record of the run is the host's).
    """

    source: str
    pairs: frozenset[tuple[int, int]] | None = None
    p2p: bool = True


def host_faults(records: Sequence[ResultRecord]) -> dict[str, HostFault]:
    """run id -> the P2P fault of that run: a runtime record of the P2P probe that failed on the host, with the
    pairs it failed for. A P2P probe that found only the topology's gaps (no peer access across the CPU
    sockets: ``undecided``, ``topology_pairs``) is the host's shape, not a fault, and is not here."""
    faults = {}
    for record in records:
        if record.tier is Tier.RUNTIME and record.outcome.status in _BROKEN_RECORD:
            faults[record.run_id] = HostFault(
                source=f"{record.feature} fails on this host in the same run ({record.probe}: "
                       f"{record.outcome.reason})", pairs=p2p_fault_pairs(record.outcome.metrics))
    return faults


def p2p_fault_pairs(metrics: Mapping[str, Any]) -> frozenset[tuple[int, int]] | None:
    """The unordered GPU pairs a P2P probe's metrics say failed (``fault_pairs`` and ``unreached_pairs``; a
    record written before those keys: every pair without access or whose copy did not arrive); None when the
    metrics do not say (the probe was killed, or they are unreadable)."""
    def pair(i: Any, j: Any) -> tuple[int, int]:
        return (min(int(i), int(j)), max(int(i), int(j)))

    try:
        if "fault_pairs" in metrics:
            listed = [*metrics["fault_pairs"], *(metrics.get("unreached_pairs") or [])]
            return frozenset(pair(i, j) for i, j in listed)
        if "matrix" in metrics or "copies" in metrics:
            matrix = metrics.get("matrix") or []
            found = {pair(i, j) for i, row in enumerate(matrix) for j, ok in enumerate(row) if i != j and not ok}
            found |= {pair(*key.split("->")) for key, text in (metrics.get("copies") or {}).items()
                      if not str(text).startswith("ok")}
            return frozenset(found)
    except (TypeError, ValueError):
        return None
    return None


def used_gpus(record: ResultRecord) -> frozenset[int] | None:
    """The GPUs (CUDA indices in the job) a record's job used: its metrics' ``devices``, else ``range`` of the
    GPU count it reports; None when it says neither (a job killed at its timeout writes no metrics). Every
    GPU job of a target in one run gets the same cards (``stackforge.edges.gpus.assign_gpus``), numbered from 0."""
    metrics = record.outcome.metrics
    try:
        if isinstance(metrics.get("devices"), list):
            return frozenset(int(d) for d in metrics["devices"])
        count = next((int(metrics[k]) for k in _GPU_COUNT_METRICS if isinstance(metrics.get(k), int)), None)
    except (TypeError, ValueError):
        return None
    return frozenset(range(count)) if count else None


def names_p2p(reason: str) -> str | None:
    """The words of a failure's reason that name P2P or CUDA IPC, or None."""
    found = _P2P_WORDS.search(reason)
    return found.group(0) if found else None


def host_check_faults(hosts: Mapping[str, Mapping[str, Any]]) -> dict[str, HostFault]:
    """run id -> the failing host check a run's ``host.json`` records (written at the start of every runtime
    and bench run, so a partial run carries it: ``stackforge.jobs.job_runner.HostGate.run_check``). Read::

        {"check": {"status": "fail", "reason": "<what failed on the host>",
                   "gpus": [<failing GPUs, nvidia-smi's host indices>] or absent (all of them),
                   "p2p": true when every failing finding concerns P2P only (IOMMU/ACS, the nvidia_uvm HMM
                          setting): it touches multi-GPU jobs only,
                   "p2p_pairs": [[i, j], ...] (CUDA indices of a job's GPUs) or absent (every pair suspect)}}

    A check whose status is not ``fail`` (``pass``, ``warn``, ``not run``) blames nothing. A non-P2P failure on
    listed GPUs adds nothing here: host indices are not a job's CUDA indices, and the job runner judged each job
    against its own cards when it ran (its record arrives ``undecided (host: ...)``, ``metrics.host_fault``)."""
    faults = {}
    for run_id, facts in hosts.items():
        check = facts.get("check") if isinstance(facts, Mapping) else None
        if not isinstance(check, Mapping) or check.get("status") != "fail":
            continue
        p2p = check.get("p2p") is True
        if not p2p and isinstance(check.get("gpus"), list):
            continue
        source = f"the host check of this run failed ({check.get('reason') or 'no reason given'})"
        try:
            pairs = frozenset((min(int(i), int(j)), max(int(i), int(j))) for i, j in check["p2p_pairs"]) \
                if p2p and isinstance(check.get("p2p_pairs"), list) else None
        except (TypeError, ValueError):
            pairs = None
        faults[run_id] = HostFault(source=source, pairs=pairs, p2p=p2p)
    return faults


def rests_on_p2p(record: ResultRecord, spec: FeatureSpec) -> bool:
    """Whether a record's failure could be the host's P2P: its feature rests on P2P (``rests_on`` in
    ``compat/knowledge.yaml``), or it is a benchmark that ran on more than one GPU (all-reduce bandwidth,
    serving with tensor parallelism: features only benchmarks speak for, outside the catalog)."""
    if P2P_FEATURE in spec.rests_on:
        return True
    if record.tier is not Tier.BENCH:
        return False
    gpus = used_gpus(record)
    if gpus is not None:
        return len(gpus) > 1
    # A bench killed before it wrote metrics: its catalog entry says whether it spans GPUs (the all-reduce sweeps).
    bench = next((b for b in bench_catalog() if b.id == record.probe), None)
    return bench is not None and bench.needs_gpu and bench.min_gpus > 1


def fault_blames(fault: HostFault, record: ResultRecord, spec: FeatureSpec) -> str | None:
    """Why this broken record is the host's under ``fault`` (None: it stays a verdict on the stack).

    A failing host check (on every GPU: :func:`host_check_faults`) blames every GPU record. A P2P fault
    (the P2P probe's, or a host check that breaks P2P only) blames only a record whose
    feature rests on P2P, and only when the pairs that failed are among the GPUs the record used (unknown
    GPUs: the run's, every job of a target gets the same cards) or its own words name P2P / IPC. So NCCL's
    and SGLang's own refusals (a Tree refusal, "no multicast", custom all-reduce disabled) in a run where P2P
    failed elsewhere, or only across the CPU sockets, stay verdicts."""
    gpus = used_gpus(record)
    if gpus is not None and not gpus:   # a job on no GPU (gloo's CPU ranks) is never the GPUs' fault
        return None
    if not fault.p2p:
        return ""
    if not rests_on_p2p(record, spec):
        return None
    if fault.pairs is None:
        return "which GPU pairs failed is unknown, so every pair is suspect"
    touched = sorted(p for p in fault.pairs if gpus is None or set(p) <= gpus)
    if touched:
        return f"it used GPU pairs that failed ({', '.join(f'{i}-{j}' for i, j in touched[:8])})"
    words = names_p2p(record.outcome.reason)
    return f"its own words name {words}" if words else None


def run_faults(*sources: Mapping[str, HostFault]) -> dict[str, tuple[HostFault, ...]]:
    """run id -> every host fault of that run, from each source (the P2P probe's records, the host checks)."""
    merged: dict[str, tuple[HostFault, ...]] = {}
    for source in sources:
        for run_id, fault in source.items():
            merged[run_id] = (*merged.get(run_id, ()), fault)
    return merged


def blame_host(records: Sequence[ResultRecord], spec: FeatureSpec,
               faults: Mapping[str, Sequence[HostFault]]) -> list[ResultRecord]:
    """The records as the cell judges them: a GPU record's (runtime or bench) failure in a run where the host
    failed in a way that touches it (:func:`fault_blames`) is the host's fault, not a verdict on the stack:
    undecided, saying so, with both reasons. The stored record is unchanged."""
    judged = []
    for record in records:
        blamed = [] if record.tier not in (Tier.RUNTIME, Tier.BENCH) or record.outcome.status not in _BROKEN_RECORD \
            else [(f, how) for f in faults.get(record.run_id, ()) if (how := fault_blames(f, record, spec)) is not None]
        fault, how = blamed[0] if blamed else (None, None)
        if fault is None or how is None:
            judged.append(record)
            continue
        why = (f"{fault.source}{'; ' + how if how else ''}; this {record.outcome.status.value} is the host's, not "
               f"a verdict on the stack: {record.outcome.reason}")
        judged.append(replace(record, outcome=replace(record.outcome, status=Status.UNDECIDED, reason=why)))
    return judged


def stack_order_key(stack_id: str, stack: Mapping[str, Any]) -> tuple[Any, ...]:
    """Version order of stacks: CUDA, torch, FlashInfer, SGLang, Python (PEP 440), then the id."""
    return (*(_version(stack.get(axis)) for axis in VERSION_AXES), stack_id)


def _version(value: Any) -> Version:
    try:
        return Version(str(value)) if value is not None else Version("0")
    except InvalidVersion:
        return Version("0")


# ---------------------------------------------------------------------------------------------- metrics


def metric_center(value: Any) -> float | None:
    """The central value of a metric: a number, a summary's median (or mean), or the median of samples."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, list):
        numbers = [float(v) for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
        return statistics.median(numbers) if numbers else None
    if isinstance(value, Mapping):
        for key in ("median", "mean", "value"):
            if isinstance(value.get(key), (int, float)) and not isinstance(value.get(key), bool):
                return float(value[key])
        if "samples" in value:
            return metric_center(value["samples"])
    return None


def headline_value(value: Any) -> float | None:
    """:func:`metric_center`, or the best of a per-variant mapping (``best_tflops: {bf16: .., fp8: ..}``)."""
    center = metric_center(value)
    if center is None and isinstance(value, Mapping):
        numbers = [metric_center(v) for v in value.values() if not isinstance(v, Mapping)]
        numbers = [n for n in numbers if n is not None]
        return max(numbers) if numbers else None
    return center


def key_metric(records: Sequence[ResultRecord]) -> Metric | None:
    """The cell's headline number: the first of the bench catalog's summary metrics (its
    :func:`~stackforge.bench.catalog.summary_metric_names`, units as declared there) found in a passing record."""
    from stackforge.bench.catalog import metric_units, summary_metric_names

    units = metric_units()
    passing = [r for r in records if r.outcome.status is Status.PASS]
    for name in summary_metric_names():
        for record in sorted(passing, key=lambda r: -TIER_PREFERENCE[r.tier]):
            value = headline_value(record.outcome.metrics.get(name))
            if value is not None:
                return Metric(name=name, value=value, unit=units.get(name, ""), probe=record.probe)
    return None


# ---------------------------------------------------------------------------------------------- provenance


def image_reference(record: ResultRecord) -> tuple[str, bool]:
    """``(reference, pinned)``: ``repo@sha256:...`` when a digest is known, else the image id or tag."""
    prov = record.provenance
    if prov.digest:
        if "@" in prov.digest:
            return prov.digest, True
        return f"{_repository(prov.image)}@{prov.digest}", True
    return (prov.image_id or prov.image or ""), False


def image_display(record: ResultRecord) -> str:
    """For people: the pinned reference, else the tag with a short image id."""
    reference, pinned = image_reference(record)
    prov = record.provenance
    if pinned or not prov.image:
        return reference
    short = (prov.image_id or "").removeprefix("sha256:")[:12]
    return f"{prov.image} (id {short}, not pinned)" if short else f"{prov.image} (not pinned)"


def _repository(image: str) -> str:
    """``registry:5000/org/name:tag`` -> ``registry:5000/org/name`` (a port is not a tag)."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


# ---------------------------------------------------------------------------------------------- text helpers


def one_line(text: str, limit: int = 300) -> str:
    """Collapse whitespace and cut to ``limit`` characters (with an ellipsis)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def source_text(source: Mapping[str, str]) -> str:
    """``ref (confidence)`` for a rule source."""
    confidence = source.get("confidence", "")
    return f"{source.get('ref', '')}{f' ({confidence})' if confidence else ''}"


def cell_label(cell: ReportCell) -> str:
    """The short text of a cell: glyph, how it was decided, key metric (e.g. ``✅ bench 1,520 tok/s``)."""
    parts = [(CONTRADICTED_GLYPH if cell.contradicted else "") + GLYPHS[cell.status]]
    if cell.how:
        parts.append(HOW_LABELS[cell.how])
    if cell.metric is not None:
        parts.append(cell.metric.text())
    return " ".join(parts)


def cell_summary(cell: ReportCell) -> str:
    """One line: status, how, reason (the hover text)."""
    how = f" ({cell.how})" if cell.how else ""
    text = f"{cell.status.value}{how}: {cell.reason}" if cell.reason else f"{cell.status.value}{how}"
    if cell.undecided and cell.status is not CellStatus.UNDECIDED:
        text += f" — {cell.undecided}"
    return one_line(f"{text} — {cell.contradicted}" if cell.contradicted else text, 400)


def header_summary(report: MatrixReport) -> str:
    """Counts for the header: stacks, pruned, measured / predicted / untested cells, contradictions."""
    sources = [c.source for _, c in report.cells()]
    pruned = sum(r.plan_status == "pruned" for r in report.rows)
    contradicted = sum(bool(c.contradicted) for _, c in report.cells())
    undecided = sum(bool(c.undecided) for _, c in report.cells())
    untested = sum(c.status is CellStatus.UNTESTED for _, c in report.cells())
    text = (f"{len(report.rows)} stacks ({pruned} pruned) × {len(report.features)} features · "
            f"{sources.count(CellSource.MEASURED)} measured, "
            f"{sources.count(CellSource.PREDICTED)} predicted, "
            f"{untested} untested cells")
    text += f" · {GLYPHS[CellStatus.UNDECIDED]} {undecided} left undecided by their probes" if undecided else ""
    text += (f" · {CONTRADICTED_GLYPH} {contradicted} rule(s) contradicted by measurement"
             if contradicted else "")
    return f"{PREDICTIONS_ONLY} · {text}" if report.predictions_only else text


def target_text(report: MatrixReport) -> str:
    """``rtx-pro-6000-x8-pcie — RTX PRO 6000 Blackwell, sm 12.0, 8 GPUs, pcie``."""
    info = report.target_info
    details = [str(info[k]) for k in ("gpu",) if info.get(k)]
    if info.get("arch"):
        details.append(f"compute capability {info['arch']}")
    if info.get("gpu_count"):
        details.append(f"{info['gpu_count']} GPUs")
    if info.get("interconnect"):
        details.append(str(info["interconnect"]))
    return f"{report.target} — {', '.join(details)}" if details else report.target


# ---------------------------------------------------------------------------------------------- driver floor


def row_driver_floor(row: ReportRow, target: str, target_min: str | None) -> DriverFloor:
    """The driver floor the plan shows for this row: its cell's ``driver_floor`` as ``plan`` wrote it
    (:func:`stackforge.plan.derive.cell_driver_floor`: the CUDA family's floor, the target's ``min_driver``,
    ``requires: driver`` rules), never recomputed from ``derived``. A stack the plan does not list has
    only the target's hardware floor."""
    if row.driver_floor is not None:
        return row.driver_floor
    return cell_driver_floor(None, "", target, target_min, ())
