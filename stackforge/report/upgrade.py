"""Two stacks side by side: what an upgrade (CUDA 12.8 -> 13.1, say) gains and loses on a target.

Everything is read off the compatibility matrix (:func:`stackforge.report.compat_matrix.build_matrix`), so the
upgrade report can never disagree with ``matrix``, ``deadends`` or ``pick``:

* each feature's cell on both sides, decided by :func:`stackforge.report.compat_matrix.decide_cell` (its ranking of
  evidence tiers included), labelled with its evidence: ``measured (<tier>)`` or ``predicted by rule
  <id>``. A prediction is never called measured;
* the change of a feature: *gained* (dead before, works after), *built* (dead before; after, the module the
  target uses compiled and linked, nothing ran it: not counted as gained), *admitted* (dead before, the code
  admits it after: not counted as gained), *lost* (works, built or admitted before, dead after), *unchanged* (the same on
  both sides), *undecided* (a side has no verdict: untested, skipped, or the probe broke), *n/a* (the
  target's hardware cannot have it: counted nowhere). Works = ``pass``, or predicted ``hazard`` /
  ``requires`` (a rule's word, which the report calls predicted, never "works"); dead = measured ``fail`` /
  ``crash`` / ``timeout``, predicted ``unavailable``, or a pruned stack. A gained, built, admitted or lost change
  whose sides rest on evidence of different strength says so; a change the images' flavours explain (one has
  nvcc, the other not, for a feature only nvcc or a JIT build decides) is *flavour*, not the upgrade's;
* the driver floor of each side as ``plan`` and ``pick`` state it (:func:`stackforge.report.compat_matrix.row_driver_floor`);
* the image ``pick`` would hand out for each side, and its size from the build record (else "unknown");
* benchmark deltas for every metric both sides' benchmarks measured with the same probe, judged against
  the runs' own noise by :func:`stackforge.report.diff.compare_metric` (which also knows each metric's direction);
* the dead ends that remain on the new stack, with what unblocks each
  (:func:`stackforge.report.deadends.find_dead_ends`) and the rule's remedy.

"The best stack of a CUDA family" is ``pick``'s choice (no required feature) among that family's
stacks; when none of them was ever probed, ``pick`` has nothing to rank and the newest stack the
plan keeps is taken instead. The report says which stack was taken and why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from stackforge.core.errors import SpecError
from stackforge.core.records import ResultRecord, Status, Tier, says_cannot_jit
from stackforge.core.textfit import brief
from stackforge.core.versions import validate_version
from stackforge.plan.derive import DriverFloor
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import (
    GLYPHS,
    PREDICTIONS_ONLY,
    VERSION_AXES,
    CellSource,
    CellStatus,
    MatrixReport,
    ReportCell,
    ReportRow,
    build_matrix,
    one_line,
    row_driver_floor,
    target_text,
)
from stackforge.report.deadends import DeadEnd, find_dead_ends
from stackforge.report.diff import MetricStats, compare_metric, lower_is_better, snapshot_from_records
from stackforge.report.evidence import Evidence
from stackforge.core.markdown import md_text
from stackforge.report.pick import (
    Candidate,
    candidates_in,
    choose,
    predicted_to_qualify,
)

if TYPE_CHECKING:
    from stackforge.plan.user_compat import UserCompat

__all__ = ["FORMATS", "UPGRADE_SCHEMA", "ChangeKind", "FeatureChange", "ImageSize", "MetricDelta",
           "RemainingDeadEnd",
           "Side", "SideCell", "StackChoice", "UpgradeReport", "build_upgrade", "change_of", "evidence_label",
           "image_sizes_from_builds", "upgrade_between", "upgrade_to_json"]

UPGRADE_SCHEMA = "stackforge.upgrade"
UPGRADE_SCHEMA_VERSION = 1
FORMATS = ("text", "md", "json", "html")

WORKS = frozenset({CellStatus.PASS, CellStatus.HAZARD, CellStatus.REQUIRES})
#: Not dead as far as the code shows, but nothing that decides the feature ran (compat/knowledge.yaml tiers).
ADMITS = frozenset({CellStatus.ADMITTED, CellStatus.BUILT})
DEAD = frozenset({CellStatus.FAIL, CellStatus.CRASH, CellStatus.TIMEOUT, CellStatus.UNAVAILABLE, CellStatus.PRUNED})
#: How a side with no measurement at all is labelled (its column header says so).
PREDICTED_ONLY = "predicted only"


class ChangeKind:
    """What an upgrade does to a feature (the order is the report's)."""

    GAINED = "gained"
    BUILT = "built"
    ADMITTED = "admitted"
    LOST = "lost"
    UNCHANGED = "unchanged"
    UNDECIDED = "undecided"
    NOT_APPLICABLE = "n/a"
    FLAVOUR = "flavour"
    ORDER = (GAINED, BUILT, ADMITTED, LOST, UNCHANGED, UNDECIDED, NOT_APPLICABLE, FLAVOUR)
    GLYPHS = MappingProxyType({GAINED: "➕", BUILT: "🔨", ADMITTED: "☑️", LOST: "➖", UNCHANGED: "＝", UNDECIDED: "❔",
                               NOT_APPLICABLE: "∅", FLAVOUR: "🧰"})
    MEANING = MappingProxyType({GAINED: "dead before, works after (measured working, or a rule's word)",
                                BUILT: "dead before; after, the module the target uses compiled and linked in the "
                                       "image, and whether it runs needs a runtime probe (not counted as gained)",
                                ADMITTED: "dead before; after, the code admits the target, and whether it works "
                                          "needs a runtime probe (not counted as gained)",
                                LOST: "works (or it built, or the code admitted it) before, dead after",
                                UNCHANGED: "the same verdict on both sides",
                                UNDECIDED: "a side has no verdict (untested, skipped, or the probe broke)",
                                NOT_APPLICABLE: "the target's hardware cannot have it on either side (counted "
                                                "nowhere)",
                                FLAVOUR: "differs because one image has nvcc (can JIT) and the other not (its "
                                         "flavour), not because of the upgrade"})


# ---------------------------------------------------------------------------------------------- model


@dataclass(frozen=True, slots=True)
class StackChoice:
    """How a side is named: a stack id, a CUDA family whose best stack is taken, or an external image
    (``--from-image`` / ``--to-image``: a reference it was probed under, its ``name@sha256`` or its digest)."""

    stack_id: str | None = None
    cuda: str | None = None
    image: str | None = None

    def describe(self) -> str:
        return self.stack_id or (f"image {self.image}" if self.image else f"CUDA {self.cuda}")


@dataclass(frozen=True, slots=True)
class ImageSize:
    """An image's size from its build record; ``None`` with the reason when it is not known."""

    bytes: int | None
    note: str = ""
    built_image: str = ""           # the build record's image (digest when pushed, else tag): built, maybe never probed

    def text(self) -> str:
        if self.bytes is None:
            return f"unknown ({self.note})" if self.note else "unknown"
        return _gigabytes(self.bytes) + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True, slots=True)
class Side:
    """One side of the upgrade: the stack taken, why, and what is known about it."""

    role: str                       # from | to
    stack_id: str
    stack: dict[str, Any]
    plan_status: str
    why: str                        # why this stack was taken
    measured: bool                  # at least one record that decided something (not a skip)
    image: str
    pinned: bool
    image_size: ImageSize
    driver_floor: DriverFloor

    @property
    def evidence(self) -> str:
        return "measured" if self.measured else PREDICTED_ONLY

    def versions(self) -> str:
        return " · ".join(f"{axis} {self.stack[axis]}" for axis in VERSION_AXES if self.stack.get(axis))


@dataclass(frozen=True, slots=True)
class SideCell:
    """A feature on one side: status, the evidence label, and the deciding text."""

    status: str
    evidence: str                   # measured (<tier>) | predicted by rule <id> | no evidence
    reason: str
    detail: str                     # the deciding record's evidence, or the rule's error
    probe: str = ""
    rule: str = ""
    level: str = ""                 # the evidence's strength alone: measured (<tier>) | predicted | ...

    def label(self) -> str:
        return f"{GLYPHS[CellStatus(self.status)]} {self.status} · {self.evidence}"


@dataclass(frozen=True, slots=True)
class FeatureChange:
    feature: str
    change: str
    before: SideCell
    after: SideCell

    @property
    def mixed_evidence(self) -> str:
        """For a gained, built, admitted or lost feature whose two sides rest on evidence of different strength
        (a rule against a measurement, one tier against another): ``from <evidence>, to <evidence>``."""
        if self.change not in (ChangeKind.GAINED, ChangeKind.BUILT, ChangeKind.ADMITTED, ChangeKind.LOST):
            return ""
        if self.before.level == self.after.level:
            return ""
        return f"evidence of different strength: from {self.before.level}, to {self.after.level}"

    def label(self) -> str:
        """``➕ gained``; an unchanged feature says whether it works on both sides (measured), is only predicted
        to (a rule's word is never "works"), built, only admitted by the code, or dead; a change on evidence of
        different strength says so."""
        text = f"{ChangeKind.GLYPHS[self.change]} {self.change}"
        if self.change == ChangeKind.UNCHANGED:
            text += f" ({unchanged_word(self.after)})"
        elif self.change == ChangeKind.GAINED and self.after.rule:
            text += " (a rule's prediction, not measured)"
        if self.mixed_evidence:
            text += f" ({self.mixed_evidence})"
        return text


def unchanged_word(cell: SideCell) -> str:
    """What an unchanged feature is on both sides, in words no stronger than the evidence."""
    status = CellStatus(cell.status)
    if status is CellStatus.PASS:
        return "works"
    if status is CellStatus.BUILT:
        return "built, not run"
    if status is CellStatus.ADMITTED:
        return "admitted by the code"
    if status in WORKS:     # hazard / requires: a rule's word
        return f"predicted {status.value}"
    if cell.rule or status is CellStatus.PRUNED:
        return f"predicted {status.value}"
    return "dead"


@dataclass(frozen=True, slots=True)
class MetricDelta:
    """One metric both sides measured with the same probe, and whether it moved beyond noise."""

    probe: str
    metric: str
    before: MetricStats
    after: MetricStats
    delta: float
    relative: float | None
    noise: float | None
    trend: str                      # improvement | regression | within noise
    higher_is_better: bool


@dataclass(frozen=True, slots=True)
class RemainingDeadEnd:
    """A feature still dead on the new stack, and what would unblock it."""

    feature: str
    cell: SideCell
    change: str                     # lost (new with the upgrade), unchanged (dead before too), undecided
    unblock: str
    remedy: str = ""

    def history(self) -> str:
        return {ChangeKind.LOST: "new with the upgrade (it works on FROM)",
                ChangeKind.UNCHANGED: "dead on FROM too"}.get(self.change, "no verdict on FROM")


@dataclass(frozen=True, slots=True)
class UpgradeReport:
    target: str
    target_label: str
    before: Side
    after: Side
    features: tuple[FeatureChange, ...]
    metrics: tuple[MetricDelta, ...]
    dead_ends: tuple[RemainingDeadEnd, ...]
    matrix_name: str = ""
    matrix_source: str = ""
    runs: tuple[str, ...] = ()
    predictions_only: bool = False

    def count(self, change: str) -> int:
        return sum(f.change == change for f in self.features)


# ---------------------------------------------------------------------------------------------- building


def build_upgrade(records: Sequence[ResultRecord], plan: Plan, target: str, before: StackChoice,
                  after: StackChoice, *, size_of: Callable[[str], ImageSize] | None = None, runs: Sequence[str] = (),
                  plan_only: bool = False, nvcc_features: frozenset[str] = frozenset(),
                  hosts: Mapping[str, Mapping[str, Any]] | None = None) -> UpgradeReport:
    """Compare two stacks of ``target``.

    Args:
        records: measured results (any targets).
        plan: the plan (predictions, pruned stacks, driver floors).
        before / after: the stacks, by id or by CUDA family.
        size_of: a stack id's image size (:func:`image_sizes_from_builds`); without it sizes are "unknown".
        runs: run ids the records came from.
        plan_only: only the plan's stacks may be taken for a CUDA family (as ``pick --plan``).
        nvcc_features: features that only an image with nvcc has
            (:func:`stackforge.plan.rules.features_only_nvcc_decides`): when one side's image has nvcc and
            the other's not, a change whose dead side such a rule predicts, or whose dead side a gate measured
            unable to JIT, is the flavour's, not the upgrade's.
        hosts: run id -> that run's ``host.json`` (:func:`stackforge.report.compat_matrix.build_matrix`).

    Raises:
        SpecError: an unknown stack id or CUDA family (naming the known ones), both sides the same stack,
            or a CUDA family whose every stack the plan prunes.
    """
    report = build_matrix(records, plan, target, runs=runs, hosts=hosts)
    candidates = {c.stack_id: c for c in candidates_in(report, target)}   # the one matrix, built once
    # A side named as a CUDA family takes its stack of the other side's flavour when the family has one, so that
    # the report compares the upgrade, not two flavours: the named stack (or TO) is resolved first.
    pool = tuple(candidates.values())
    if before.cuda is None and after.cuda is not None:   # the named side first
        old_row, old_why = _resolve(report, pool, before, "from", plan_only)
        new_row, new_why = _resolve(report, pool, after, "to", plan_only, flavour=_flavour(old_row))
    else:
        new_row, new_why = _resolve(report, pool, after, "to", plan_only)
        old_row, old_why = _resolve(report, pool, before, "from", plan_only, flavour=_flavour(new_row))
    old, new = (_side(role, row, why, candidates.get(row.stack_id), report,
                      size_of(row.stack_id) if size_of is not None else None)
                for role, row, why in (("from", old_row, old_why), ("to", new_row, new_why)))
    if old.stack_id == new.stack_id:
        raise SpecError(f"FROM and TO are the same stack ({old.stack_id}): an upgrade needs two stacks",
                        remedy="name two different stack ids or CUDA versions")
    old_row, new_row = report.row(old.stack_id), report.row(new.stack_id)
    flavours_differ = _has_nvcc(old_row) != _has_nvcc(new_row)
    features = tuple(_feature_change(f, old_row.cell(f), new_row.cell(f), flavours_differ, nvcc_features)
                     for f in report.features)
    ordered = tuple(sorted(features, key=lambda c: ChangeKind.ORDER.index(c.change)))
    return UpgradeReport(target=target, target_label=target_text(report), before=old, after=new,
                         features=ordered, metrics=_metric_deltas(old_row, new_row),
                         dead_ends=_remaining_dead_ends(report, new_row, features), matrix_name=report.matrix_name,
                         matrix_source=report.matrix_source, runs=tuple(runs),
                         predictions_only=report.predictions_only)


def upgrade_between(evidence: Evidence, before: StackChoice, after: StackChoice, *, builds_dir: Path | None = None,
                    plan_only: bool = False, user: UserCompat | None = None) -> UpgradeReport:
    """``stackforge upgrade``'s one library entry: :func:`build_upgrade` on the loaded evidence, image sizes
    from the build records of ``builds_dir`` (unknown without), and the features only nvcc decides from the
    shipped rules (and ``user``'s)."""
    from stackforge.plan.planner import load_knowledge
    from stackforge.plan.rules import features_only_nvcc_decides

    return build_upgrade(evidence.records, evidence.plan, evidence.target, before, after,
                         size_of=image_sizes_from_builds(builds_dir) if builds_dir is not None else None,
                         runs=evidence.runs, plan_only=plan_only, hosts=evidence.hosts,
                         nvcc_features=features_only_nvcc_decides(load_knowledge(user=user).rules))


def cuda_label(stack: Mapping[str, Any]) -> str:
    """A side's CUDA as a header says it: ``12.8``, or for an external image its CUDA (nvcc's, else its torch's;
    ``no CUDA`` for a CPU-only image) and the image."""
    cuda = str(stack.get("cuda") or "")
    if not stack.get("external"):
        return cuda or "?"
    return f"{cuda or 'no CUDA'} (image {stack.get('image')})"


def _flavour(row: ReportRow) -> str:
    """The row's flavour; none for an external image (no matrix stack has its flavour to match)."""
    return "" if row.stack.get("external") else str(row.stack.get("flavour") or "devel")


def _resolve(report: MatrixReport, candidates: tuple[Candidate, ...], choice: StackChoice, role: str,
             plan_only: bool, flavour: str = "") -> tuple[ReportRow, str]:
    option = "FROM" if role == "from" else "TO"
    if choice.image is not None:
        return _image_row(report, choice.image, role), f"the image given as --{role}-image"
    if choice.stack_id is not None:
        known = [r.stack_id for r in report.rows]
        if choice.stack_id not in known:
            raise SpecError(f"unknown stack id {choice.stack_id!r} for {option} on target {report.target}; "
                            f"known: {', '.join(known) or '(none)'}",
                            remedy="copy an id from `stackforge matrix` or `stackforge plan`")
        return report.row(choice.stack_id), f"given as {option}"
    return _best_of_family(report, candidates, str(choice.cuda), role, plan_only, flavour)


def _image_row(report: MatrixReport, ref: str, role: str) -> ReportRow:
    """The row of the external image ``ref`` names (probed with ``probe --image``).

    Raises:
        SpecError: no probed image is that one on this target, naming the ones that are.
    """
    from stackforge.probes.image_facts import matches_image

    rows = [r for r in report.rows if matches_image(r.stack, ref)]
    if len(rows) == 1:
        return rows[0]
    images = [f"{r.stack_id} ({r.stack.get('image')})" for r in report.rows if r.stack.get("external")]
    if rows:
        raise SpecError(f"--{role}-image {ref} names {len(rows)} probed images on target {report.target}: "
                        f"{', '.join(r.stack_id for r in rows)}", remedy="give its name@sha256:... or its digest")
    raise SpecError(f"--{role}-image {ref}: no image probed under that reference on target {report.target}; "
                    f"probed images: {', '.join(images) or '(none)'}",
                    remedy=f"stackforge probe --image {ref} --target {report.target} first")


def _best_of_family(report: MatrixReport, candidates: tuple[Candidate, ...], cuda: str, role: str,
                    plan_only: bool, flavour: str = "") -> tuple[ReportRow, str]:
    """``pick``'s choice among the stacks of CUDA ``cuda`` (of ``flavour`` when the family has a stack of it that
    the plan keeps); else the newest kept one, never probed."""
    option = f"--{role}-cuda"
    wanted = _loose(validate_version(cuda, what=option))
    family = [r for r in report.rows if _loose(str(r.stack.get("cuda"))) == wanted]
    if plan_only:
        family = [r for r in family if r.plan_status != "unplanned"]
    if not family:
        have = sorted({str(r.stack.get("cuda")) for r in report.rows}, key=_loose)
        raise SpecError(f"no stack with CUDA {cuda} for {option} on target {report.target}; the stacks have "
                        f"CUDA {', '.join(have) or '(none)'}: {', '.join(r.stack_id for r in report.rows) or '(none)'}",
                        remedy=f"pass a CUDA version those stacks have to {option}, or name stack ids")
    kept = [r for r in family if r.plan_status != "pruned"]
    same = [r for r in kept if _flavour(r) == flavour]
    note, chosen_from = "", family
    if flavour and same and len(same) < len(kept):
        chosen_from, note = same, f"; taken of the other side's flavour ({flavour}), so the flavours do not differ"
    elif flavour and not same:
        note = f"; no kept CUDA {cuda} stack has the other side's flavour ({flavour})"
    chosen_row, why = _best_in(report, candidates, chosen_from, family, cuda, role)
    return chosen_row, why + note


def _best_in(report: MatrixReport, candidates: tuple[Candidate, ...], chosen_from: Sequence[ReportRow],
             family: Sequence[ReportRow], cuda: str, role: str) -> tuple[ReportRow, str]:
    """pick's choice among ``chosen_from`` (part of CUDA ``cuda``'s ``family``, which the reason counts)."""
    option = f"--{role}-cuda"
    ids = {r.stack_id for r in chosen_from}
    mine = tuple(c for c in candidates if c.stack_id in ids)
    chosen = choose(mine, report.target)
    if chosen is not None:
        return report.row(chosen.candidate.stack_id), _why_picked(chosen.candidate, cuda, family)
    hopeful = predicted_to_qualify(mine)
    if hopeful:
        return report.row(hopeful[0]), (f"newest CUDA {cuda} stack the plan keeps, out of {_family_size(family)}: "
                                        "none of them was probed on this target, so pick has no image to rank")
    pruned = ", ".join(sorted(ids))
    raise SpecError(f"every CUDA {cuda} stack for {option} is pruned by the plan on target {report.target}: {pruned}",
                    remedy="see `stackforge plan --explain STACK_ID` for the rule, or name a stack id")


def _family_size(family: Sequence[ReportRow]) -> str:
    """``4 (3 pruned by the plan)``."""
    pruned = sum(r.plan_status == "pruned" for r in family)
    return f"{len(family)} ({pruned} pruned by the plan)" if pruned else str(len(family))


def _why_picked(candidate: Candidate, cuda: str, family: Sequence[ReportRow]) -> str:
    text = (f"best CUDA {cuda} stack by pick's ranking (probed, then serving / all-reduce / GEMM throughput, "
            f"then newest), out of {_family_size(family)}")
    if candidate.metric is not None:
        text += f"; its best {candidate.metric.name}: {candidate.metric.text()}"
    return text


def _side(role: str, row: ReportRow, why: str, candidate: Candidate | None, report: MatrixReport,
          size: ImageSize | None) -> Side:
    measured = any(r.outcome.status is not Status.SKIP for r in row.records)
    floor = row_driver_floor(row, report.target, report.target_info.get("min_driver"))
    image = candidate.image if candidate is not None else ""
    pinned = candidate.pinned if candidate is not None else False
    if size is None:
        size = ImageSize(None, "no build record; pass --builds, the folder of stackforge build --out")
    return Side(role=role, stack_id=row.stack_id, stack=dict(row.stack), plan_status=row.plan_status, why=why,
                measured=measured, image=image, pinned=pinned, image_size=size, driver_floor=floor)


def evidence_label(cell: ReportCell) -> str:
    """``measured (<tier>)``, ``predicted by rule <id>``, ``target hardware``, or ``no evidence``: never a
    prediction called measured."""
    if cell.status is CellStatus.PRUNED:
        return "predicted by rule " + ", ".join(f.rule.id for f in cell.pruned_by) + " (stack pruned)"
    if cell.source is CellSource.PREDICTED:
        rule = cell.prediction.rule if cell.prediction is not None else ""
        return f"predicted by rule {rule}" if rule else "no evidence"
    return _evidence_level(cell)


def _evidence_level(cell: ReportCell) -> str:
    """:func:`evidence_label` without the rule's id: what two sides compare to say their evidence differs."""
    if cell.source is CellSource.MEASURED and cell.tier is not None:
        return f"measured ({cell.tier.value})"
    return {CellSource.PREDICTED: "predicted by a rule", CellSource.TARGET: "target hardware"}.get(
        cell.source, "no evidence")


def _side_cell(cell: ReportCell) -> SideCell:
    decisive = cell.decisive
    predicted = cell.source is CellSource.PREDICTED and cell.prediction is not None
    return SideCell(status=cell.status.value, evidence=evidence_label(cell), reason=cell.reason,
                    detail=cell.evidence, probe=decisive.probe if decisive is not None else "",
                    rule=cell.prediction.rule if predicted and cell.prediction else "",
                    level=_evidence_level(cell))


def change_of(before: CellStatus, after: CellStatus) -> str:
    """gained / admitted / lost / unchanged / undecided / n/a (see the module docstring)."""
    if CellStatus.NOT_APPLICABLE in (before, after):
        return ChangeKind.NOT_APPLICABLE
    if before in DEAD and after in WORKS:
        return ChangeKind.GAINED
    if before in DEAD and after is CellStatus.BUILT:
        return ChangeKind.BUILT
    if before in DEAD and after in ADMITS:
        return ChangeKind.ADMITTED
    if before in WORKS | ADMITS and after in DEAD:
        return ChangeKind.LOST
    if before in WORKS | ADMITS | DEAD and after in WORKS | ADMITS | DEAD:
        return ChangeKind.UNCHANGED
    return ChangeKind.UNDECIDED


def _has_nvcc(row: ReportRow) -> bool | None:
    """Whether the row's image has nvcc, as the plan derived it (None when the plan does not say)."""
    return (row.derived or {}).get("has_nvcc")


def _dead_for_the_flavour(cell: ReportCell, nvcc_features: frozenset[str]) -> bool:
    """Dead because its image has no nvcc: a rule that speaks of nvcc alone predicts it, or a gate measured the
    image cannot JIT what the feature builds."""
    if cell.source is CellSource.PREDICTED:
        return cell.status is CellStatus.UNAVAILABLE and cell.feature in nvcc_features
    decisive = cell.decisive
    return cell.dead and decisive is not None and says_cannot_jit(decisive)


def _feature_change(feature: str, before: ReportCell, after: ReportCell, flavours_differ: bool,
                    nvcc_features: frozenset[str]) -> FeatureChange:
    """The change of one feature; a gained, built, admitted or lost one whose dead side is dead for its image's
    flavour (no nvcc) while the other image has nvcc is the flavour's, not the upgrade's."""
    change = change_of(before.status, after.status)
    if flavours_differ and change in (ChangeKind.GAINED, ChangeKind.BUILT, ChangeKind.ADMITTED, ChangeKind.LOST):
        dead = before if change != ChangeKind.LOST else after
        if _dead_for_the_flavour(dead, nvcc_features):
            change = ChangeKind.FLAVOUR
    return FeatureChange(feature=feature, change=change, before=_side_cell(before), after=_side_cell(after))


def _metric_deltas(before: ReportRow, after: ReportRow) -> tuple[MetricDelta, ...]:
    """Every metric of a passing benchmark that both stacks measured with the same probe."""
    old, new = _metrics(before), _metrics(after)
    deltas = []
    for key in sorted(set(old) & set(new)):
        probe, metric = key
        change = compare_metric(("", "", probe, metric), old[key], new[key])
        deltas.append(MetricDelta(probe=probe, metric=metric, before=change.before, after=change.after,
                                  delta=change.delta, relative=change.relative, noise=change.noise,
                                  trend=change.trend, higher_is_better=not lower_is_better(metric)))
    return tuple(deltas)


def _metrics(row: ReportRow) -> dict[tuple[str, str], MetricStats]:
    """Metrics of the row's passing benchmarks. Probes record numbers too (``max_abs_diff``, rows verified):
    evidence of their result, not a performance to compare."""
    passing = [r for r in row.records if r.outcome.status is Status.PASS and r.tier is Tier.BENCH]
    snapshot = snapshot_from_records(passing, row.stack_id)
    return {(probe, metric): stats for (_, _, probe, metric), stats in snapshot.metrics.items()}


def _remaining_dead_ends(report: MatrixReport, after: ReportRow,
                         changes: Sequence[FeatureChange]) -> tuple[RemainingDeadEnd, ...]:
    if after.plan_status == "pruned":
        return ()     # the stack as a whole is the dead end; the feature table says so cell by cell
    dead_ends = {d.feature: d for d in find_dead_ends(report).dead_ends}
    change = {c.feature: c.change for c in changes}
    remaining = []
    for cell in after.cells:
        dead = dead_ends.get(cell.feature)
        if cell.dead and dead is not None:
            remedy = cell.prediction.remedy if cell.prediction is not None else ""
            remaining.append(RemainingDeadEnd(feature=cell.feature, cell=_side_cell(cell), change=change[cell.feature],
                                              unblock=_unblock_text(dead, report, after), remedy=remedy))
    return tuple(remaining)


def _unblock_text(dead: DeadEnd, report: MatrixReport, after: ReportRow) -> str:
    unblock = dead.unblocked_by
    if unblock is None:
        return "no stack in this matrix unblocks it"
    other = report.row(unblock.stack_id).stack
    moves = [f"{axis} {after.stack.get(axis)} → {other.get(axis)}" for axis in VERSION_AXES
             if other.get(axis) != after.stack.get(axis)]
    differs = f" ({', '.join(moves)})" if moves else ""
    if unblock.basis == "measured":
        return f"measured to pass ({unblock.tier}) on {unblock.stack_id}{differs}: {unblock.detail}"
    if unblock.basis == "built":
        return (f"built for the target ({unblock.tier}) on {unblock.stack_id}{differs}, not run on a GPU: "
                f"{unblock.detail}")
    if unblock.basis == "admitted":
        return (f"the code admits it ({unblock.tier}) on {unblock.stack_id}{differs}, not measured working: "
                f"{unblock.detail}")
    return f"predicted to work on {unblock.stack_id}{differs}, not measured: {unblock.detail}"


def image_sizes_from_builds(builds_dir: Path) -> Callable[[str], ImageSize]:
    """A stack id's image size from its build record in ``builds_dir`` (a ``stackforge build --out`` folder).

    The lookup reads one record when asked; a corrupt record raises RecordError (with its path).
    """
    from stackforge.build.records import read_record

    def size_of(stack_id: str) -> ImageSize:
        record = read_record(builds_dir, stack_id)
        if record is None:
            return ImageSize(None, f"no build record for this stack in {builds_dir}")
        if not record.status.ok:
            return ImageSize(None, f"its build {record.status.value}")
        built = record.repo_digest or record.image_tag or ""
        if record.image_size is None:
            return ImageSize(None, "its build record has no size", built)
        return ImageSize(record.image_size, "build record", built)

    return size_of


def _loose(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        return Version("0")


# ---------------------------------------------------------------------------------------------- shared text


def _gigabytes(size: int) -> str:
    """Decimal GB, as ``docker image ls`` prints them."""
    return f"{size / 1e9:.2f} GB"


def size_change(report: UpgradeReport) -> str:
    old, new = report.before.image_size.bytes, report.after.image_size.bytes
    if old is None or new is None:
        return "unknown (a side has no build record)"
    delta = new - old
    return f"{'+' if delta >= 0 else '-'}{_gigabytes(abs(delta))}"


def floor_change(report: UpgradeReport) -> str:
    old, new = report.before.driver_floor.version, report.after.driver_floor.version
    if old is None or new is None:
        return "unknown (a side has no known floor)"
    if _loose(old) == _loose(new):
        return f"unchanged (>= {new})"
    return f"{'raised' if _loose(new) > _loose(old) else 'lowered'} from >= {old} to >= {new}"


#: How the headline names each count: "gained" alone never covers what only the code admits.
_COUNT_WORDS = MappingProxyType({ChangeKind.GAINED: "gained (measured working or a rule's word)",
                                 ChangeKind.BUILT: "built (compiled and linked, needs a runtime probe)",
                                 ChangeKind.ADMITTED: "admitted by the code (needs a runtime probe)"})


def summary_line(report: UpgradeReport) -> str:
    counts = ", ".join(f"{report.count(c)} {_COUNT_WORDS.get(c, c)}" for c in ChangeKind.ORDER
                       if c not in (ChangeKind.BUILT, ChangeKind.FLAVOUR, ChangeKind.NOT_APPLICABLE) or report.count(c))
    moved = [m for m in report.metrics if m.trend != "within noise"]
    bench = (f"{len(report.metrics)} shared benchmark metric(s), {len(moved)} beyond noise" if report.metrics
             else "no benchmark measured on both sides")
    text = (f"{counts} · driver floor {floor_change(report)} · image {size_change(report)} · {bench} · "
            f"{len(report.dead_ends)} dead end(s) remain")
    return f"{PREDICTIONS_ONLY} · {text}" if report.predictions_only else text


def stats_text(stats: MetricStats) -> str:
    """``89.5 (88.9–90.1, n=5)``: the centre, the observed range (or ± half the spread), the repeats."""
    if stats.low is not None and stats.high is not None and stats.n > 1:
        return f"{stats.center:.4g} ({stats.low:.4g}–{stats.high:.4g}, n={stats.n})"
    if stats.spread is not None:
        return f"{stats.center:.4g} (±{stats.spread / 2:.3g}, n={stats.n})"
    return f"{stats.center:.4g} (n={stats.n}, spread unknown)"


def delta_text(delta: MetricDelta) -> str:
    relative = f" ({delta.relative:+.1%})" if delta.relative is not None else ""
    return f"{delta.delta:+.4g}{relative}"


def trend_text(delta: MetricDelta) -> str:
    better = "higher is better" if delta.higher_is_better else "lower is better"
    noise = f"noise {delta.noise:.3g}" if delta.noise is not None else "noise unknown: single values"
    return f"{delta.trend} ({noise}; {better})"


# ---------------------------------------------------------------------------------------------- json


def upgrade_to_json(report: UpgradeReport) -> dict[str, Any]:
    """The versioned JSON document (``stackforge.upgrade`` v1)."""
    return {"schema": UPGRADE_SCHEMA, "schema_version": UPGRADE_SCHEMA_VERSION, "target": report.target,
            "matrix": {"name": report.matrix_name, "source": report.matrix_source}, "runs": list(report.runs),
            "predictions_only": report.predictions_only,
            "from": _side_json(report.before), "to": _side_json(report.after),
            "summary": {**{c: report.count(c) for c in ChangeKind.ORDER},
                        "driver_floor": floor_change(report), "image_size": size_change(report)},
            "features": [{"feature": f.feature, "change": f.change, "mixed_evidence": f.mixed_evidence or None,
                          "from": _cell_json(f.before), "to": _cell_json(f.after)} for f in report.features],
            "benchmarks": [_delta_json(m) for m in report.metrics],
            "dead_ends_after": [{"feature": d.feature, "to": _cell_json(d.cell), "change": d.change,
                                 "history": d.history(), "unblock": d.unblock, "remedy": d.remedy}
                                for d in report.dead_ends]}


def _side_json(side: Side) -> dict[str, Any]:
    # Keys sorted: the document reads the same whether the plan was planned here or read from a file.
    return {"stack_id": side.stack_id, "stack": dict(sorted(side.stack.items())),
            "plan_status": side.plan_status, "why": side.why,
            "evidence": side.evidence, "image": side.image or None, "pinned": side.pinned,
            "built_image": side.image_size.built_image or None,
            "image_size_bytes": side.image_size.bytes, "image_size_note": side.image_size.note,
            "driver_floor": side.driver_floor.to_json()}


def _cell_json(cell: SideCell) -> dict[str, Any]:
    return {"status": cell.status, "evidence": cell.evidence, "reason": cell.reason, "detail": cell.detail,
            "probe": cell.probe or None, "rule": cell.rule or None}


def _delta_json(delta: MetricDelta) -> dict[str, Any]:
    def stats(s: MetricStats) -> dict[str, Any]:
        return {"center": s.center, "low": s.low, "high": s.high, "spread": s.spread, "n": s.n}

    return {"probe": delta.probe, "metric": delta.metric, "from": stats(delta.before), "to": stats(delta.after),
            "delta": delta.delta, "relative": delta.relative, "noise": delta.noise, "verdict": delta.trend,
            "higher_is_better": delta.higher_is_better}


# ---------------------------------------------------------------------------------------------- markdown


def write_upgrade_md(report: UpgradeReport) -> str:
    """The upgrade as GitHub-flavoured markdown (a PR comment)."""
    old, new = report.before, report.after
    lines = [f"### stackforge upgrade · CUDA {_md(cuda_label(old.stack))} → {_md(cuda_label(new.stack))} "
             f"on {_md(report.target_label)}", ""]
    if report.matrix_name or report.runs:
        parts = [f"matrix {report.matrix_name} ({report.matrix_source})"] if report.matrix_name else []
        parts += [f"runs: {', '.join(report.runs)}"] if report.runs else []
        lines += [_md(" · ".join(parts)), ""]
    lines += [_md(summary_line(report)), ""]
    lines += ["| | from | to |", "|---|---|---|"]
    for label, values in _side_rows(old, new):
        lines.append(f"| {label} | {values[0]} | {values[1]} |")
    lines += ["", "#### Features", "",
              f"| feature | change | from `{old.stack_id}`{_md_only(old)} | to `{new.stack_id}`{_md_only(new)} |",
              "|---|---|---|---|"]
    for item in report.features:
        lines.append(f"| `{item.feature}` | {item.label()} | "
                     f"{_md(item.before.label())} | {_md(item.after.label())} |")
    legend = " · ".join(f"{ChangeKind.GLYPHS[c]} {c}: {ChangeKind.MEANING[c]}" for c in ChangeKind.ORDER)
    lines += ["", "**Legend** " + legend
              + ". *measured (gate)* = decided inside the image without a GPU · *measured (runtime)* = a probe on "
              "the GPU · *measured (bench)* = a benchmark · *measured (wheel)* = the release's own code read from "
              "its wheel, no image · *predicted by rule X* = a compat rule says so, nothing measured it.", "", "#### Evidence", ""]
    for item in report.features:
        if item.before == item.after:     # the same rule (or nothing) on both sides: say it once
            lines.append(f"- `{item.feature}` ({item.change}) — both: {_md_cell(item.after)}")
        else:
            lines.append(f"- `{item.feature}` ({item.change}) — from: {_md_cell(item.before)} — "
                         f"to: {_md_cell(item.after)}")
    lines += ["", "#### Benchmarks measured on both sides", ""]
    if report.metrics:
        lines += ["| probe · metric | from | to | delta | verdict |", "|---|---|---|---|---|"]
        lines += [f"| {_md(f'`{m.probe}` · {m.metric}')} | {stats_text(m.before)} | {stats_text(m.after)} | "
                  f"{delta_text(m)} | {_md(trend_text(m))} |" for m in report.metrics]
    else:
        lines.append("None: no benchmark measured the same metric on both stacks.")
    lines += ["", "#### Dead ends that remain after the upgrade", ""]
    if not report.dead_ends:
        lines.append(f"None on `{new.stack_id}`.")
    for dead in report.dead_ends:
        text = (f"- **{dead.feature}** ({dead.history()}): {_md_cell(dead.cell)} — way out: "
                f"{_md(dead.unblock)}")
        lines.append(text + (f" — remedy per rule: {_md(dead.remedy)}" if dead.remedy else ""))
    return "\n".join(lines) + "\n"


def _side_rows(old: Side, new: Side) -> list[tuple[str, tuple[str, str]]]:
    def both(get: Any) -> tuple[str, str]:
        return get(old), get(new)

    return [
        ("stack", both(lambda s: f"`{s.stack_id}`" + (f" ({s.plan_status})" if s.plan_status != "kept" else ""))),
        ("versions", both(lambda s: _md(s.versions()))),
        ("why this stack", both(lambda s: _md(s.why))),
        ("evidence", both(lambda s: "measured" if s.measured else f"**{PREDICTED_ONLY}** — no probe result")),
        ("image", both(lambda s: _md_image(*image_text(s)))),
        ("image size", both(lambda s: _md(s.image_size.text()))),
        ("driver floor", both(lambda s: _md(s.driver_floor.text() + (
            f" ({'; '.join(s.driver_floor.because)})" if s.driver_floor.because else "")))),
    ]


def image_text(side: Side) -> tuple[str, str]:
    """``(reference, note)``: the image a side's evidence came from (what ``pick`` hands out), else the one
    built and never probed, else none."""
    if side.image:
        return side.image, "pinned by digest" if side.pinned else "not pinned"
    if side.image_size.built_image:
        return side.image_size.built_image, "built, never probed on this target: no evidence it works"
    return "", "none: never probed on this target"


def _md_image(reference: str, note: str) -> str:
    return _md(f"`{reference}` ({note})") if reference else _md(note)


def _md_only(side: Side) -> str:
    return "" if side.measured else f" ({PREDICTED_ONLY})"


def _md_cell(cell: SideCell) -> str:
    text = f"{cell.status}, {cell.evidence}"
    text += f" probe `{cell.probe}`" if cell.probe else ""
    text += f": {cell.reason}" if cell.reason else ""
    if cell.detail:
        text += f" `{one_line(cell.detail, 240).replace('`', chr(39))}`"
    return _md(text)


def _md(text: Any) -> str:
    """Table-safe, inert markdown: one line, record and rule text escaped (:func:`~stackforge.core.markdown.
    md_text`: no raw HTML, no ``javascript:`` link), no pipe breaks a row."""
    return md_text(" ".join(str(text).split())).replace("|", "\\|")


# ------------------------------------------------------------------------------------------- one screen

#: The longest line the one-screen text prints.
SCREEN = 200


def write_upgrade_text(report: UpgradeReport) -> str:
    """One screen: the answer (the counts), the two stacks, then a line per feature that changed or stays
    dead (change, each side's status and evidence level, a brief reason, the probe or rule); the full
    evidence is in ``--format md`` / ``html`` / ``json`` and ``--evidence``."""
    old, new = report.before, report.after
    lines = [f"upgrade CUDA {cuda_label(old.stack)} -> {cuda_label(new.stack)} on {report.target}:",
             *(f"  {brief(part, SCREEN - 2)}" for part in summary_line(report).split(" · ")),
             f"  from {old.stack_id} ({old.evidence})", f"  to   {new.stack_id} ({new.evidence})"]
    width = max((len(f.feature) for f in report.features), default=0)
    for item in report.features:
        if item.change == ChangeKind.NOT_APPLICABLE:
            continue
        side = item.after
        which = side.probe or (f"rule {side.rule}" if side.rule else "")
        prefix = (f"  {item.feature:<{width}}  {item.change:<9}  {item.before.status:>9} -> {side.status:<9}  "
                  f"{side.level or side.evidence}{f' [{which}]' if which else ''}: ")
        lines.append(prefix + brief(side.reason or "no evidence", max(20, min(100, SCREEN - len(prefix) - 18))))
    hidden = report.count(ChangeKind.NOT_APPLICABLE)
    if hidden:
        lines.append(f"  {hidden} feature(s) n/a on {report.target} (the hardware cannot have them)")
    lines.append(f"  {len(report.dead_ends)} dead end(s) remain on {new.stack_id}; --evidence or --format md / html "
                 "/ json: every side's reason, code lines and sources")
    return "\n".join(lines) + "\n"
