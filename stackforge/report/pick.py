"""Pick the best known-good image for a target, by evidence.

A stack qualifies when:

* the plan did not prune it for the target;
* every required feature is *measured* to pass (a ``gate``-tier pass counts, flagged "gate evidence
  only", when no runtime or bench result exists -- e.g. nightly CI without the GPU; so does a
  ``wheel``-tier pass, the release's own code read from its wheel, flagged "wheel evidence only"
  and ranked below gate);
* the driver, when given, meets the stack's driver floor, the one the plan shows: the highest of
  the CUDA family's minor-version compatibility floor (the plan's derived ``min_driver``), the
  target's own ``min_driver`` and any ``requires: driver`` rule (compared as versions, so
  ``"580.95.05" >= "580"``); the driver bundled with the toolkit release is not required;
* an image that was actually probed exists (the records' provenance).

Among the qualifiers, measured evidence beats gate-only evidence, then the best metric wins
(``optimize="throughput"``: serving ``output_throughput`` (median when repeated), else all-reduce
``peak_busbw_gbps``, else GEMM ``best_tflops``, as the bench catalog declares them: see
:func:`stackforge.bench.catalog.throughput_metrics`; a stack with a serving number outranks one with
only a bandwidth number), then the newer stack (PEP 440 order of
CUDA, torch, FlashInfer, SGLang, Python). ``optimize="newest"`` skips the metric.

Exit codes the CLI uses (documented here, mapped only in :mod:`stackforge.cli.pick`):

====  ==========================================================================
 0    picked, every requirement backed by a runtime/bench measurement
 5    picked, but at least one requirement rests on gate evidence only (the image
      reference is still printed; treat as "probably works, not yet run on the GPU")
 4    nothing qualifies (:class:`~stackforge.core.errors.NothingQualifiesError`: the
      closest stack and what blocks it). Also with predictions only (no probe
      results at all): a prediction is never known-good, so no image is printed;
      the stacks the rules allow are named as the ones to build and probe
 2    bad input (unknown feature or target, bad driver string, unusable records)
====  ==========================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from stackforge.core.errors import NothingQualifiesError, SpecError
from stackforge.core.records import ResultRecord, Status, Tier
from stackforge.core.versions import validate_version
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import (
    CellSource,
    CellStatus,
    MatrixReport,
    Metric,
    ReportCell,
    ReportRow,
    build_matrix,
    check_features,
    headline_value,
    image_reference,
    one_line,
    row_driver_floor,
    stack_order_key,
)

__all__ = ["EXIT_GATE_ONLY", "EXIT_PICKED", "OPTIMIZE", "Candidate", "Pick", "PickAnswer",
           "RequirementCheck", "Scope",
           "candidates_in", "choose", "closest_first", "evaluate_candidates", "explain_shortfall", "pick", "pick_to_json",
           "predicted_to_qualify", "predictions_only_shortfall", "shortfall_remedy", "with_verification"]

EXIT_PICKED = 0
EXIT_GATE_ONLY = 5
OPTIMIZE = ("throughput", "newest")
#: Unmeasured cell statuses that leave a feature possible: no rule says it is unavailable (an undecided
#: probe is no verdict either way).
_NOT_RULED_OUT = frozenset({CellStatus.UNTESTED, CellStatus.UNDECIDED, CellStatus.HAZARD, CellStatus.REQUIRES})
#: Record statuses that are never evidence for an image: a skipped probe says nothing about the
#: feature, and an undecided one could not reach what decides it.
_NOT_EVIDENCE = frozenset({Status.SKIP, Status.UNDECIDED})


@dataclass(frozen=True, slots=True)
class RequirementCheck:
    """One requirement of one candidate: met or not, and the evidence line that says so."""

    name: str           # a feature, or "plan" / "image" / "driver"
    met: bool
    line: str
    gate_only: bool = False    # met on gate or wheel evidence only (nothing ran on the GPU)
    unmeasured: bool = False   # not met only because nothing measured it (no rule rules it out)
    wheel_only: bool = False   # met on wheel evidence only (the release's code read, no image probed)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A stack judged against the requirements."""

    stack_id: str
    stack: dict[str, Any]
    image: str
    pinned: bool
    checks: tuple[RequirementCheck, ...]
    metric: Metric | None
    metric_rank: int
    warnings: tuple[str, ...]
    order_key: tuple[Any, ...]

    @property
    def blockers(self) -> tuple[RequirementCheck, ...]:
        return tuple(c for c in self.checks if not c.met)

    @property
    def qualifies(self) -> bool:
        return not self.blockers

    @property
    def gate_only(self) -> bool:
        return any(c.gate_only for c in self.checks if c.met)

    @property
    def wheel_only(self) -> bool:
        return any(c.wheel_only for c in self.checks if c.met)


@dataclass(frozen=True, slots=True)
class Scope:
    """Which stacks may be picked: some toolkits (``--cuda``), some ids (``--only``), the plan's stacks.

    ``plan_only`` holds when the user handed over a plan or matrix: a stack the plan does not
    contain (measured by an older run, say) is then not a candidate at all.
    """

    cuda: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    plan_only: bool = False

    def select(self, rows: Sequence[ReportRow]) -> tuple[ReportRow, ...]:
        """The rows in scope. Raises SpecError for an id or toolkit that no stack has (listing those known)."""
        chosen = tuple(rows)
        if self.plan_only:
            chosen = tuple(r for r in chosen if r.plan_status != "unplanned")
        if self.cuda:
            chosen = self._by_cuda(chosen)
        if self.only:
            known = sorted(r.stack_id for r in chosen)
            unknown = [i for i in self.only if i not in known]
            if unknown:
                raise SpecError(f"unknown stack id(s) for --only: {', '.join(unknown)}; valid: "
                                f"{', '.join(known) or '(none)'}",
                                remedy="copy an id from `stackforge plan` or `stackforge matrix`")
            chosen = tuple(r for r in chosen if r.stack_id in self.only)
        return chosen

    def _by_cuda(self, rows: tuple[ReportRow, ...]) -> tuple[ReportRow, ...]:
        wanted = {_loose_version(validate_version(c, what="--cuda")) for c in self.cuda}
        have = {_loose_version(str(r.stack.get("cuda"))): str(r.stack.get("cuda")) for r in rows}
        missing = [c for c in self.cuda if _loose_version(c) not in have]
        if missing:
            raise SpecError(f"no stack with CUDA {', '.join(missing)} for this pick; the stacks have CUDA "
                            f"{', '.join(sorted(set(have.values()), key=_loose_version)) or '(none)'}")
        return tuple(r for r in rows if _loose_version(str(r.stack.get("cuda"))) in wanted)


@dataclass(frozen=True, slots=True)
class Pick:
    """The chosen image and why."""

    target: str
    candidate: Candidate
    optimize: str
    considered: int

    @property
    def reference(self) -> str:
        """``repo@sha256:...`` when pinned, else the local image id or tag."""
        return self.candidate.image

    @property
    def exit_code(self) -> int:
        return EXIT_GATE_ONLY if self.candidate.gate_only else EXIT_PICKED

    def why(self) -> tuple[str, ...]:
        """One line for the choice, then one per requirement with its evidence."""
        head = f"picked {self.candidate.stack_id} for {self.target} out of {self.considered} stack(s)"
        if self.candidate.metric is not None and self.optimize == "throughput":
            head += f"; best {self.candidate.metric.name}: {self.candidate.metric.text()}"
        elif self.optimize == "newest":
            head += "; newest qualifying stack"
        return (head, *(f"✔ {c.line}" for c in self.candidate.checks))

    def warnings(self) -> tuple[str, ...]:
        gate_note = ("some requirements rest on gate evidence only (decided without a GPU); "
                     "run the runtime probes on the target to confirm")
        if self.candidate.wheel_only:
            gate_note = ("some requirements rest on wheel evidence only (the release's code read from its "
                         "wheel, no image probed); run the gate and runtime probes to confirm")
        extra = (gate_note,) if self.candidate.gate_only else ()
        return self.candidate.warnings + extra


@dataclass(frozen=True, slots=True)
class PickAnswer:
    """What ``stackforge pick`` answers: the pick (or None) among the candidates judged, and everything
    its text, its JSON and its shortfall error are written from."""

    target: str
    require: tuple[str, ...]
    driver: str | None
    candidates: tuple[Candidate, ...]
    chosen: Pick | None
    predictions_only: bool = False

    def picked(self) -> Pick:
        """The pick. Raises :meth:`shortfall` when nothing qualifies."""
        if self.chosen is None:
            raise self.shortfall()
        return self.chosen

    def shortfall(self, where: str | None = None) -> NothingQualifiesError:
        """The error for nothing qualifying (exit 4): with predictions only, the stacks to build and
        probe; else the closest stack and, without ``where``, each of its blockers in the message
        (with ``where``, the message says where they are listed instead). ``exc.shortfall`` holds the
        candidates, closest first."""
        if self.predictions_only:
            error = predictions_only_shortfall(self.candidates, self.target)
        elif where is None:
            error = NothingQualifiesError(explain_shortfall(self.candidates, self.target, self.require, self.driver),
                                          remedy=shortfall_remedy(self.target))
        else:
            error = NothingQualifiesError(_brief_shortfall(self.candidates, self.target, where),
                                          remedy=shortfall_remedy(self.target))
        error.shortfall = closest_first(self.candidates)  # type: ignore[attr-defined]
        return error

    def shortfall_lines(self) -> tuple[str, ...]:
        """The closest stacks (three) and every blocker of each, one per line."""
        ordered = closest_first(self.candidates)
        if not ordered:
            return (explain_shortfall(self.candidates, self.target, self.require, self.driver),)
        lines = [f"no image qualifies for {self.target}; closest first:"]
        for candidate in ordered[:3]:
            image = f" ({candidate.image})" if candidate.image else ""
            lines.append(f"  {candidate.stack_id}{image}: {len(candidate.blockers)} blocker(s)")
            lines += [f"    ✘ {check.line}" for check in candidate.blockers]
        return tuple(lines)

    def to_json(self) -> dict[str, Any]:
        """Versioned JSON for ``stackforge pick --format json`` (a pick, or the shortfall)."""
        payload = pick_to_json(self.chosen, self.candidates, self.target, self.require, self.driver)
        payload["predictions_only"] = self.predictions_only
        return payload


def pick(records: Sequence[ResultRecord], plan: Plan, target: str,
         require: Sequence[str] = (), driver: str | None = None, optimize: str = "throughput", *,
         scope: Scope | None = None, predictions_only: bool = False,
         hosts: Mapping[str, Mapping[str, Any]] | None = None) -> PickAnswer:
    """Pick the best image for ``target`` by evidence: the one library entry of ``stackforge pick``.

    Args:
        records: measured results (any targets).
        plan: the plan (predictions, pruned stacks, driver floors); a plan file is read with
            :meth:`stackforge.plan.planner.Plan.read`.
        target: target profile name.
        require: features that must work.
        driver: the host's driver version (``"580.95.05"``), or None to skip the driver check.
        optimize: ``"throughput"`` or ``"newest"``.
        scope: which stacks may be picked at all (toolkits, stack ids, the plan's stacks only).
        predictions_only: there are no probe results at all (the shortfall then names stacks to probe).
        hosts: run id -> that run's ``host.json``: a GPU failure of a run whose host check failed is the host's.

    Raises:
        SpecError: an unknown feature, target, optimize value or a driver that is not a version.
    """
    candidates = evaluate_candidates(records, plan, target, require, driver, optimize, scope=scope, hosts=hosts)
    chosen = choose(candidates, target, optimize)
    return PickAnswer(target, tuple(require), driver, candidates, chosen, predictions_only)


def with_verification(answer: PickAnswer, verified: Mapping[str, tuple[bool, str]],
                      optimize: str = "throughput") -> PickAnswer:
    """``pick --verify``: each candidate named in ``verified`` (stack id -> (ok, the one line that says so))
    gains a ``qualification`` requirement, met only when its image's attached record was verified; the
    choice is made again among those that still qualify."""
    candidates = tuple(
        replace(c, checks=(*c.checks, RequirementCheck("qualification", verified[c.stack_id][0],
                                                       verified[c.stack_id][1])))
        if c.stack_id in verified else c
        for c in answer.candidates)
    chosen = choose(candidates, answer.target, optimize)
    return replace(answer, candidates=candidates, chosen=chosen)


def _brief_shortfall(candidates: Sequence[Candidate], target: str, where: str) -> str:
    ordered = closest_first(candidates)
    if not ordered:
        return f"no image qualifies for target {target}: no stack has results or plan entries for it"
    closest = ordered[0]
    return (f"no image qualifies for target {target}; closest is {closest.stack_id} with "
            f"{len(closest.blockers)} blocker(s) ({where})")


def choose(candidates: Sequence[Candidate], target: str, optimize: str = "throughput") -> Pick | None:
    """The best qualifying candidate (see the module docstring for the order), or None."""
    qualifying = [c for c in candidates if c.qualifies]
    if not qualifying:
        return None
    best = max(qualifying, key=lambda c: _rank(c, optimize))
    return Pick(target=target, candidate=best, optimize=optimize, considered=len(candidates))


def shortfall_remedy(target: str) -> str:
    """Where to look next when nothing qualifies."""
    return (f"see `stackforge deadends --target {target}` for what blocks each feature, "
            "or `stackforge matrix` for the evidence")


def evaluate_candidates(records: Sequence[ResultRecord], plan: Plan, target: str,
                        require: Sequence[str] = (), driver: str | None = None,
                        optimize: str = "throughput", *, scope: Scope | None = None,
                        hosts: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[Candidate, ...]:
    """Judge every stack known for ``target`` (in version order, within ``scope``) against the requirements,
    on the compatibility matrix built once for them."""
    if optimize not in OPTIMIZE:
        raise SpecError(f"unknown optimize goal {optimize!r}; choose one of {', '.join(OPTIMIZE)}")
    report = build_matrix(records, plan, target, hosts=hosts)
    unmeasured = [f for f in require if f not in report.features]
    if unmeasured:
        # A feature only a probe decides (p2p-access...) has no column until a record measures it; it is
        # still a feature (the same names `matrix --feature` and `list features` know), its cells unknown.
        check_features(unmeasured, report.features)
        report = build_matrix(records, plan, target, features=(*report.features, *unmeasured), hosts=hosts)
    return candidates_in(report, target, require, driver, scope=scope)


def candidates_in(report: MatrixReport, target: str, require: Sequence[str] = (), driver: str | None = None, *,
                  scope: Scope | None = None) -> tuple[Candidate, ...]:
    """The candidates of a matrix already built for ``target`` (its columns hold every required feature):
    what ``upgrade`` ranks its CUDA families with, on the one matrix it reports from."""
    host_driver = _driver_version(driver)
    target_min = report.target_info.get("min_driver")
    rows = (scope or Scope()).select(report.rows)
    return tuple(_candidate(row, target, tuple(require), driver, host_driver, target_min) for row in rows)


def predicted_to_qualify(candidates: Sequence[Candidate]) -> tuple[str, ...]:
    """Stacks, newest first, that only lack measurements: the rules rule out none of the requirements.

    What ``pick`` names when there are predictions only: candidates to build and probe, never an image.
    """
    newest_first = sorted(candidates, key=lambda c: c.order_key, reverse=True)
    return tuple(c.stack_id for c in newest_first if all(check.unmeasured for check in c.blockers))


def predictions_only_shortfall(candidates: Sequence[Candidate], target: str) -> NothingQualifiesError:
    """Why ``pick`` prints no image when there are no probe results at all (exit 4, never 0 or 5)."""
    hopeful = predicted_to_qualify(candidates)
    head = f"no image qualifies for target {target}: predictions only — no probe results, so no image is known-good"
    if not hopeful:
        return NothingQualifiesError(f"{head}; the rules, the plan or the driver rule out every stack",
                                     remedy=shortfall_remedy(target))
    more = " ..." if len(hopeful) > 3 else ""
    return NothingQualifiesError(f"{head}; the rules allow {len(hopeful)} stack(s), newest first: "
                                 f"{', '.join(hopeful[:3])}{more}",
                                 remedy="build and probe those (stackforge build / probe --only STACK_ID), "
                                        "then pick again")


def closest_first(candidates: Sequence[Candidate]) -> tuple[Candidate, ...]:
    """Candidates by fewest blockers, the newer stack first among equals."""
    newest_first = sorted(candidates, key=lambda c: c.order_key, reverse=True)
    return tuple(sorted(newest_first, key=lambda c: len(c.blockers)))


def explain_shortfall(candidates: Sequence[Candidate], target: str, require: Sequence[str],
                      driver: str | None) -> str:
    """Why nothing qualifies: the closest stack and each of its blockers, then the runners-up."""
    wanted = ", ".join(require) or "nothing"
    head = f"no image qualifies for target {target} (require: {wanted}"
    head += f"; driver {driver})" if driver else ")"
    if not candidates:
        return f"{head}: no stack has results or plan entries for this target"
    ordered = closest_first(candidates)
    closest = ordered[0]
    image = f", image {closest.image}" if closest.image else ""
    blockers = "; ".join(f"[{i}] {c.line}" for i, c in enumerate(closest.blockers, 1))
    text = (f"{head}. Closest: {closest.stack_id}{image} with {len(closest.blockers)} "
            f"blocker{'s' if len(closest.blockers) != 1 else ''}: {blockers}.")
    others = ", ".join(f"{c.stack_id} ({len(c.blockers)})" for c in ordered[1:6])
    if others:
        text += f" Next closest (blockers): {others}{' …' if len(ordered) > 6 else ''}."
    return text


def pick_to_json(result: Pick | None, candidates: Sequence[Candidate], target: str,
                 require: Sequence[str], driver: str | None) -> dict[str, Any]:
    """Versioned JSON for ``stackforge pick --format json`` (a pick, or the shortfall)."""
    payload: dict[str, Any] = {"schema": "stackforge.pick", "schema_version": 1, "target": target,
                               "require": list(require), "driver": driver}
    if result is not None:
        payload |= {"status": "picked-gate-only" if result.candidate.gate_only else "picked",
                    "exit_code": result.exit_code, "image": result.reference,
                    "pinned": result.candidate.pinned, "stack_id": result.candidate.stack_id,
                    "why": list(result.why()), "warnings": list(result.warnings()),
                    "metric": _metric_json(result.candidate.metric)}
    else:
        payload |= {"status": "nothing-qualifies", "exit_code": NothingQualifiesError.exit_code,
                    "explanation": explain_shortfall(candidates, target, require, driver)}
    payload["candidates"] = [_candidate_json(c) for c in closest_first(candidates)]
    return payload


# ---------------------------------------------------------------------------------------------- internals


def _candidate(row: ReportRow, target: str, require: tuple[str, ...], driver: str | None,
               host_driver: Version | None, target_min: str | None) -> Candidate:
    checks = [_plan_check(row)]
    checks += [_feature_check(row.cell(feature)) for feature in require]
    checks.append(_driver_check(row, target, driver, host_driver, target_min))
    # Wheel-tier records read a release's wheel, not an image: they name none.
    imaged = [r for r in row.records if r.tier is not Tier.WHEEL and r.outcome.status is not Status.UNDECIDED]
    evidence = [r for f in require for r in row.cell(f).records
                if r.outcome.status not in _NOT_EVIDENCE and r.tier is not Tier.WHEEL]
    image, pinned, warnings = _image(evidence or imaged)
    pinning = "pinned by digest" if pinned else "not pinned"
    checks.append(RequirementCheck("image", bool(image), f"image {image} ({pinning})" if image
                                   else _no_image_line(row), unmeasured=not image))
    metric, rank = _throughput(row.records)
    return Candidate(stack_id=row.stack_id, stack=row.stack, image=image, pinned=pinned, checks=tuple(checks),
                     metric=metric, metric_rank=rank, warnings=warnings,
                     order_key=stack_order_key(row.stack_id, row.stack))


def _no_image_line(row: ReportRow) -> str:
    if any(r.outcome.status is Status.UNDECIDED for r in row.records):
        return "no image: every probe of this stack on this target was undecided (no evidence for an image)"
    return "no image: this stack was never probed on this target"


def _plan_check(row: ReportRow) -> RequirementCheck:
    if row.plan_status == "pruned":
        why = "; ".join(f"rule {f.rule.id}: {one_line(f.rule.reason, 200)}" for f in row.pruned_by)
        return RequirementCheck("plan", False, f"stack pruned by the plan ({why})")
    if row.plan_status == "unplanned":
        return RequirementCheck("plan", True, "stack measured but not in the plan (no rule checked it)")
    return RequirementCheck("plan", True, "stack kept by the plan (no rule makes it incompatible)")


def _feature_check(cell: ReportCell) -> RequirementCheck:
    decisive = cell.decisive
    if cell.source is CellSource.MEASURED and cell.status is CellStatus.PASS and decisive is not None:
        gate_only = decisive.tier in (Tier.GATE, Tier.WHEEL)
        label = f"pass on {decisive.tier.value} evidence only" if gate_only else "pass"
        line = (f"{cell.feature}: {label} ({decisive.tier.value} probe {decisive.probe}: "
                f"{one_line(cell.reason, 160)})")
        if cell.evidence:
            line += f" — evidence: {one_line(cell.evidence, 160)}"
        if cell.contradicted:
            line += " — note: contradicts a rule's prediction"
        return RequirementCheck(cell.feature, True, line, gate_only=gate_only,
                                wheel_only=decisive.tier is Tier.WHEEL)
    # Admitted and built are no "works": the code admits the target, or its module compiled and linked, and only
    # a tier that decides the feature can say more; like an untested cell, it waits for a probe.
    unmeasured = (cell.source is not CellSource.MEASURED and cell.status in _NOT_RULED_OUT
                  or cell.status in (CellStatus.ADMITTED, CellStatus.BUILT))
    return RequirementCheck(cell.feature, False, _blocked_line(cell), unmeasured=unmeasured)


def _blocked_line(cell: ReportCell) -> str:
    decisive = cell.decisive
    if cell.status is CellStatus.NOT_APPLICABLE:
        return f"{cell.feature}: {one_line(cell.reason, 240)}"
    if cell.source is CellSource.MEASURED and decisive is not None:
        admitted = cell.status in (CellStatus.ADMITTED, CellStatus.BUILT)
        said = {CellStatus.ADMITTED: "admitted by the code only, not measured working",
                CellStatus.BUILT: "built for the target (compiled and linked), not run on a GPU"}.get(
                    cell.status, cell.status.value)
        line = (f"{cell.feature}: {said} ({decisive.tier.value} probe {decisive.probe}: "
                f"{one_line(cell.reason, 200 if admitted else 160)})")
        return line + (f" — evidence: {one_line(cell.evidence, 160)}" if cell.evidence else "")
    if cell.status is CellStatus.PRUNED:
        return f"{cell.feature}: stack pruned"
    if cell.source is CellSource.PREDICTED and cell.prediction is not None:
        line = (f"{cell.feature}: predicted {cell.status.value} by rule {cell.prediction.rule} "
                f"({one_line(cell.reason, 160)}), not measured")
        return line + (f" — {one_line(cell.undecided, 200)}" if cell.undecided else "")
    if cell.status is CellStatus.UNDECIDED:
        return f"{cell.feature}: no verdict, {one_line(cell.undecided, 240)}"
    if cell.status is CellStatus.SKIP:
        return f"{cell.feature}: no verdict, probes skipped ({one_line(cell.reason, 160)})"
    return f"{cell.feature}: no evidence (never probed, no rule)"


def _driver_check(row: ReportRow, target: str, driver: str | None, host: Version | None,
                  target_min: str | None) -> RequirementCheck:
    floor = row_driver_floor(row, target, target_min)
    specs = [(f.rule.id, str(f.rule.requires["driver"])) for f in row.findings
             if f.rule.requires and f.rule.requires.get("driver")]
    wanted = floor.text() if floor.version else ""
    because = f" ({'; '.join(floor.because)})" if floor.because else ""
    if host is None:
        return RequirementCheck("driver", True,
                                f"driver not checked (pass --driver; this stack needs {wanted}{because})"
                                if wanted else "driver not checked (no minimum known for this stack)")
    too_old = floor.version is not None and host < _loose_version(floor.version)
    unmet = [s for _, s in specs if not _spec_allows(s, host)]
    if too_old or unmet:
        needs = " and ".join(([wanted] if wanted else []) + unmet)
        return RequirementCheck("driver", False,
                                f"driver {driver} is too old: this stack needs {needs}{because}")
    return RequirementCheck("driver", True, f"driver {driver} meets {wanted}" if wanted
                            else f"driver {driver} (no minimum known for this stack)")


def _image(records: Sequence[ResultRecord]) -> tuple[str, bool, tuple[str, ...]]:
    """The image of the newest evidence record, and warnings about pinning and mixed images."""
    with_image = [r for r in records if image_reference(r)[0]]
    if not with_image:
        return "", False, ()
    newest = max(with_image, key=lambda r: (r.created_at, r.run_id))
    reference, pinned = image_reference(newest)
    warnings = []
    if not pinned:
        warnings.append(f"{reference} is not pinned by digest (the image was never pushed to a registry); "
                        "the same tag may point at another image elsewhere")
    distinct = sorted({image_reference(r)[0] for r in with_image})
    if len(distinct) > 1:
        warnings.append(f"the evidence comes from {len(distinct)} different images ({', '.join(distinct)}); "
                        f"picked the newest, {reference}")
    return reference, pinned, tuple(warnings)


def _throughput(records: Sequence[ResultRecord]) -> tuple[Metric | None, int]:
    """Best throughput metric of a stack, and how relevant it is (serve > all-reduce > GEMM > none)."""
    from stackforge.bench.catalog import metric_units, throughput_metrics

    # What ``optimize="throughput"`` compares, most relevant first, as the bench catalog declares it:
    # a stack with a serving number outranks one with only a bandwidth number.
    ranked, units = throughput_metrics(), metric_units()
    passing = [r for r in records if r.outcome.status is Status.PASS]
    for index, (label, names) in enumerate(ranked):
        found = [(value, r.probe, name) for r in passing for name in names
                 if (value := headline_value(r.outcome.metrics.get(name))) is not None]
        if found:
            value, probe, name = max(found)
            rank = len(ranked) - index
            return Metric(name=label, value=value, unit=units.get(name, ""), probe=probe), rank
    return None, 0


def _rank(candidate: Candidate, optimize: str) -> tuple[Any, ...]:
    # Runtime/bench evidence beats gate evidence, which beats wheel evidence (code read, not run).
    measured = (not candidate.gate_only, not candidate.wheel_only)
    if optimize == "newest":
        return (*measured, candidate.order_key)
    value = candidate.metric.value if candidate.metric is not None else 0.0
    return (*measured, candidate.metric_rank, value, candidate.order_key)


def _driver_version(driver: str | None) -> Version | None:
    if driver is None:
        return None
    try:
        return Version(driver)
    except InvalidVersion:
        raise SpecError(f"driver {driver!r} is not a version like 580.95.05") from None


def _loose_version(text: str) -> Version:
    try:
        return Version(str(text))
    except InvalidVersion:
        return Version("0")


def _spec_allows(spec: str, version: Version) -> bool:
    try:
        return SpecifierSet(spec).contains(version, prereleases=True)
    except InvalidSpecifier:
        return True   # the plan validated rule specifiers; an odd one must not block a pick


def _metric_json(metric: Metric | None) -> dict[str, Any] | None:
    return None if metric is None else {"name": metric.name, "value": metric.value, "unit": metric.unit,
                                        "probe": metric.probe}


def _candidate_json(candidate: Candidate) -> dict[str, Any]:
    return {"stack_id": candidate.stack_id, "image": candidate.image, "pinned": candidate.pinned,
            "qualifies": candidate.qualifies, "gate_only": candidate.gate_only,
            "blockers": [c.line for c in candidate.blockers], "checks": [c.line for c in candidate.checks],
            "metric": _metric_json(candidate.metric), "warnings": list(candidate.warnings)}

