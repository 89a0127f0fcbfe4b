"""What every report is built from: the measured records, the plan, the target and how current they are.

:func:`load_evidence` is the one place ``matrix``, ``deadends``, ``pick`` and ``upgrade`` get their
evidence: the records of a results folder (strictly, unless ``skip_bad``), the plan (a plan file, a matrix
file planned here, the runs' own matrix, or none), the target, and the currency against the last watch.
With ``read_wheels`` the matrix's pinned releases are read from their wheels first (the wheel tier, a new
run in the results folder). Warnings and progress go through the callbacks; the CLI prints them.

A run that did not finish is said here, once for every report: one line per such run ("interrupted: 1 of 8
probes ran (run <id>; ...)"), and each probe its manifest planned that never ran reads "not run (run
interrupted)" in its cell, unless another run recorded that key since (:func:`with_not_run`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stackforge.core.errors import SpecError, StackforgeError
from stackforge.core.records import NOT_RUN_RUNNER, Outcome, PlannedJob, Provenance, ResultRecord, Status
from stackforge.plan.planner import Plan
from stackforge.report.compat_matrix import choose_target
from stackforge.results.store import (
    LoadedResults,
    PartialRun,
    describe_problems,
    holds_results,
    load_results,
    merge_records,
)
from stackforge.watch.currency import Currency, currency
from stackforge.watch.state import WatchState, read_state, state_path

if TYPE_CHECKING:
    from stackforge.plan.user_compat import UserCompat

__all__ = ["Evidence", "EvidenceRequest", "load_evidence", "skip_or_refuse", "with_external_cells", "with_not_run"]


@dataclass(frozen=True, slots=True)
class EvidenceRequest:
    """Where a report's evidence comes from (the CLI's ``--results``, ``--run``, ``--plan``, ``--matrix``,
    ``--no-plan``, ``--target``, ``--skip-bad``, ``--read-wheels``, ``--compat``), already checked for
    options that exclude each other."""

    results: Path
    runs: tuple[str, ...] = ()
    plan_path: Path | None = None
    matrix: str | None = None
    no_plan: bool = False
    target: str | None = None
    skip_bad: bool = False
    read_wheels: bool = False
    user_compat: UserCompat | None = None
    command: tuple[str, ...] = ()      # recorded with a wheel-tier run


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a report is built from."""

    records: tuple[ResultRecord, ...]
    plan: Plan
    target: str
    runs: tuple[str, ...]
    #: no probe results at all: every cell is a prediction (reports and pick say so)
    predictions_only: bool = False
    #: how current the evidence is: the newest releases read, and newer ones the last watch saw
    currency: Currency | None = None
    #: with ``read_wheels``: the ABI reading's warning lines (an extension of a kept stack needing torch
    #: symbols its torch does not export, a reading skipped); () when every extension matches
    abi_warnings: tuple[str, ...] = ()
    #: run id -> that run's ``host.json``: a GPU record of a run whose host check failed is the host's
    hosts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def load_evidence(request: EvidenceRequest, *, warn: Callable[[str], None] = lambda message: None,
                  tell: Callable[[str], None] = lambda line: None) -> Evidence:
    """Load the records (strictly unless ``skip_bad``) and the plan, and settle the target.

    Without any results (no folder, or no run in it) the plan alone is the evidence: predictions
    are what a user wants first, before anything is built. ``--run`` and ``--no-plan`` still need
    results, since there would be nothing to show.

    Raises:
        RecordError: unusable record files (all listed) without ``skip_bad``; a plan file that does not read.
        SpecError: an unknown target, matrix or feature; a matrix that does not plan.
    """
    results = request.results
    if request.read_wheels:
        _read_wheels(request, tell)
    predictions_only = not request.runs and not request.no_plan and not holds_results(results)
    loaded = (LoadedResults(records=(), source=str(results)) if predictions_only
              else load_results(results, runs=request.runs))
    skip_or_refuse(loaded, request.skip_bad, warn)
    if loaded.shadowed:
        warn(loaded.shadowed_note())
    records = with_not_run(loaded, warn)
    plan = _plan(loaded, request, strict=predictions_only, warn=warn)
    chosen = choose_target(records, plan, request.target)
    if not request.no_plan:   # --no-plan: measured results only, an external image's predictions included
        plan = with_external_cells(plan, records, chosen, request.user_compat, warn)
    if predictions_only:
        warn(f"predictions only — no probe results in {results}: every cell is what the rules predict "
             "(--read-wheels reads the releases' own code in seconds, no image; `stackforge probe` measures)")
    runs = tuple(info.run_id for info in loaded.runs)
    current = currency(loaded.records, (cell.stack.to_json() for cell in plan.cells), _watch_state(results, warn))
    abi = _read_abi(plan, tell) if request.read_wheels else ()
    return Evidence(records=records, plan=plan, target=chosen, runs=runs,
                    predictions_only=predictions_only, currency=current, abi_warnings=abi,
                    hosts=loaded.hosts)


def with_external_cells(plan: Plan, records: Sequence[ResultRecord], target: str, user_compat: UserCompat | None,
                        warn: Callable[[str], None]) -> Plan:
    """The plan, plus a cell for ``target`` per external image the records hold (``probe --image``): the rules
    judge an image a team runs as they judge a matrix stack (:mod:`stackforge.plan.external`)."""
    planned = {c.stack_id for c in plan.cells_for_target(target)}
    images = {r.stack_id: r.stack for r in records if r.stack.get("external") and r.stack_id not in planned}
    if not images:
        return plan
    from stackforge.plan.external import external_plan_cells
    from stackforge.plan.planner import load_knowledge

    knowledge = load_knowledge(user=user_compat)
    profile = plan.target(target) or knowledge.targets.get(target)
    if profile is None:
        return plan
    made = external_plan_cells(images, (profile,), knowledge)
    for note in made.notes:
        warn(note)
    targets = plan.targets if plan.target(target) else (*plan.targets, profile)
    return replace(plan, targets=targets, cells=(*plan.cells, *made.cells))


def with_not_run(loaded: LoadedResults, warn: Callable[[str], None]) -> tuple[ResultRecord, ...]:
    """The records, plus a ``skip`` "not run (run interrupted)" for each job a partial run planned and never ran,
    merged like any record (a measurement, or anything a later run recorded, outranks it); one warning line per
    partial run that still shows (or that kept no manifest, so nothing says which of its jobs are missing).

    The added records exist only in the reports' memory: nothing is written, and a skip decides no cell, so a
    cell reads "not run" only where no run ever said more.
    """
    records = loaded.records
    for run in loaded.partial:
        missing = tuple(_not_run_record(run, job) for job in run.not_run)
        merged = merge_records(records, missing)
        shows = {id(record) for record in missing} & {id(record) for record in merged}
        if shows or not run.manifest:
            warn(run.line())
        records = merged
    return records


def _not_run_record(run: PartialRun, job: PlannedJob) -> ResultRecord:
    """What a cell of a job the run never reached reads, dated when the run started (older than anything it wrote)."""
    outcome = Outcome(Status.SKIP, run.not_run_reason(), evidence=run.line())
    return ResultRecord(run_id=run.run_id, stack_id=job.stack_id, stack=dict(job.stack), target=job.target,
                        probe=job.probe, feature=job.feature, tier=job.tier, outcome=outcome,
                        provenance=Provenance(runner=NOT_RUN_RUNNER), created_at=run.started_at)


def skip_or_refuse(loaded: LoadedResults, skip_bad: bool, warn: Callable[[str], None]) -> None:
    """Refuse unusable files (listing all of them), or with ``skip_bad`` warn with their count and paths."""
    if not loaded.problems:
        return
    if not skip_bad:
        loaded.raise_for_problems()
    warn(f"--skip-bad: ignoring {describe_problems(loaded.problems, loaded.source)}")


def _read_wheels(request: EvidenceRequest, tell: Callable[[str], None]) -> None:
    """The wheel tier for the matrix's kept stacks on the target, recorded as a new run of the results."""
    from stackforge.edges.index import IndexRequest
    from stackforge.plan.selection import StackSelection
    from stackforge.probes.campaign import ProbeRequest, run_probe_campaign
    from stackforge.results.store import ResultsFolder

    tell(f"reading the pinned releases' wheels from the index into {request.results} (the wheel tier: their own "
         "code, no image, no GPU)")
    targets = (request.target,) if request.target else ()
    probe = ProbeRequest(StackSelection(request.matrix, targets=targets, user_compat=request.user_compat),
                         tier="wheel", index=IndexRequest())
    records = run_probe_campaign(probe, store=ResultsFolder(request.results, command=request.command),
                                 connect=lambda: None)
    tell(f"read {len(records)} reading(s)")


def _read_abi(plan: Plan, tell: Callable[[str], None]) -> tuple[str, ...]:
    """The ABI reading of the plan's kept stacks (:func:`stackforge.wheels.abi.check_stacks`): never fails
    the command (what it could not read is one of its warning lines)."""
    from stackforge.edges.index import configured_indexes
    from stackforge.wheels.abi import check_stacks

    cells = [(stack, plan.cells_for(stack)[0].derived) for stack in plan.kept_stacks()]
    tell(f"reading the compiled extensions of {len(cells)} stack(s) against their torch (ABI, by range requests)")
    return check_stacks(cells, indexes=configured_indexes()).warnings()


def _watch_state(results: Path, warn: Callable[[str], None]) -> WatchState | None:
    """The last watch's state in the results folder; a corrupt one is warned about, not fatal to a report."""
    if not results.is_dir():
        return None
    try:
        return read_state(state_path(results))
    except SpecError as exc:
        warn(f"{exc.one_line()}; the report is not compared with the index")
        return None


def _plan(loaded: LoadedResults, request: EvidenceRequest, *, strict: bool, warn: Callable[[str], None]) -> Plan:
    if request.no_plan:
        return Plan.empty()
    if request.plan_path is not None:
        return Plan.read(request.plan_path)
    # The runs remember the matrix they were planned from; use it when it is here and unambiguous.
    run_matrices = sorted({i.matrix_source for i in loaded.runs if i.matrix_source})
    own = run_matrices[0] if len(run_matrices) == 1 and Path(run_matrices[0]).is_file() else None
    try:
        return _plan_matrix(request.matrix or own, request.target, request.user_compat)
    except StackforgeError as exc:
        if request.matrix is not None or strict:
            raise   # asked for explicitly, or the only evidence there is: its errors are the user's to see
        warn(f"no predictions: planning the default matrix failed ({exc.one_line()}); showing measured "
             "cells only (pass --plan or --matrix)")
        return Plan.empty()


def _plan_matrix(matrix: str | None, target: str | None, user_compat: UserCompat | None) -> Plan:
    """Plan a matrix with the shipped knowledge (and a user compat directory on top)."""
    from stackforge.core.data import resolve_matrix_path
    from stackforge.plan.planner import plan_file

    return plan_file(resolve_matrix_path(matrix), targets=(target,) if target else (), user_compat=user_compat)

